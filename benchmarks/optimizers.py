"""FlatAdam against torch.optim.Adam(fused=True) on the real workloads' gradient steps.

Issue 26 asks whether :class:`~rlstruct.learn.optim.FlatAdam` (parameters and gradients in one
flat buffer each) pays anywhere but on sub-10-second CartPole runs. This script times one whole
minibatch step (zero the gradients, forward, backward, clip the global norm to 0.5, Adam's
update) of the models the real workloads train, with each optimizer, interleaved rep by rep on
one torch thread, and prints the medians and their ratio:

* ``pong``: PPO's Nature CNN (``CNNActorCritic``, 6 actions) on minibatches of 256 uint8
  frames ``(256, 4, 84, 84)`` (rl-zoo's and CleanRL's Atari settings);
* ``halfcheetah64`` / ``halfcheetah256``: PPO's MLP actor-critic with a Gaussian head
  (``head_actor_critic``, 17 observations, 6 actions, hidden 64 or 256) on minibatches of 64;
* ``cartpole``: the 4-64-64-2 MLP on minibatches of 256, where FlatAdam was measured first.

The loss is a PPO-shaped surrogate (log-probabilities of stored actions times advantages, a
squared value error and the entropy), so forward and backward cost what PPO's do.

Run: ``python benchmarks/optimizers.py [--reps 30] [--out optimizers.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from _common import environment, pin_threads

pin_threads(1)

import torch  # noqa: E402
from gymnasium import spaces  # noqa: E402

from rlstruct.learn.distributions import space_spec  # noqa: E402
from rlstruct.learn.nets import CNNActorCritic, head_actor_critic  # noqa: E402
from rlstruct.learn.optim import adam, flat_adam, gradient_step  # noqa: E402


def workload(name: str) -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    """The model and a PPO-shaped loss on one fixed minibatch."""
    g = torch.Generator().manual_seed(0)
    if name == "pong":
        model: torch.nn.Module = CNNActorCritic(6)
        obs = torch.randint(0, 256, (256, 4, 84, 84), dtype=torch.uint8, generator=g)
        actions = torch.randint(0, 6, (256,), generator=g)
    elif name.startswith("halfcheetah"):
        hidden = int(name.removeprefix("halfcheetah"))
        box = spaces.Box(-1.0, 1.0, (6,))
        model = head_actor_critic(17, space_spec(box), hidden)
        obs = torch.randn(64, 17, generator=g)
        actions = torch.rand(64, 6, generator=g) * 2 - 1
    else:
        model = head_actor_critic(4, space_spec(spaces.Discrete(2)), 64)
        obs = torch.randn(256, 4, generator=g)
        actions = torch.randint(0, 2, (256,), generator=g)
    adv = torch.randn(obs.shape[0], generator=g)
    target = torch.randn(obs.shape[0], generator=g)

    def loss(m: torch.nn.Module) -> torch.Tensor:
        params, value = m(obs)
        logp, entropy = m.head.log_prob(params, actions), m.head.entropy(params)
        return -(logp * adv).mean() + 0.5 * (value - target).pow(2).mean() - 0.01 * entropy.mean()

    return model, loss


def measure(name: str, reps: int) -> dict[str, Any]:
    """Median ms of one step with each optimizer, interleaved, and their ratio."""
    models = {}
    for kind in ("flat_adam", "adam_fused"):
        torch.manual_seed(0)
        model, loss = workload(name)
        build = flat_adam if kind == "flat_adam" else adam
        models[kind] = (model, loss, build(model.parameters(), lr=2.5e-4, device="cpu", eps=1e-5))
    times: dict[str, list[float]] = {k: [] for k in models}
    n_inner = 3 if name == "pong" else 50
    for rep in range(reps + 2):
        for kind, (model, loss, optimizer) in models.items():
            start = time.perf_counter()
            for _ in range(n_inner):
                gradient_step(optimizer, loss(model), 0.5)
            if rep >= 2:  # two warm-up reps
                times[kind].append((time.perf_counter() - start) / n_inner * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"workload": name, "ms_flat_adam": med["flat_adam"], "ms_adam_fused": med["adam_fused"],
            "flat_over_fused": med["flat_adam"] / med["adam_fused"],
            "reps": reps, "steps_per_rep": n_inner}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--workloads", nargs="+",
                   default=["pong", "halfcheetah64", "halfcheetah256", "cartpole"])
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args()
    rows = []
    print(f"{'workload':16} {'FlatAdam ms':>12} {'Adam fused ms':>14} {'Flat/fused':>11}")
    for name in args.workloads:
        row = measure(name, args.reps)
        rows.append(row)
        print(f"{name:16} {row['ms_flat_adam']:12.3f} {row['ms_adam_fused']:14.3f} "
              f"{row['flat_over_fused']:11.3f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "environment": environment()}, f, indent=2)


if __name__ == "__main__":
    main()

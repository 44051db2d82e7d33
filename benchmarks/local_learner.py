"""What the one-rank learner group costs: PPO's learn step called directly, and through
:class:`~rlstruct.learners.local.LocalLearner` (what ``Run.learner_group`` returns with one
learner), on the same CartPole batches, interleaved.

Every algorithm learns through a learner group since issue 26 (one learn path). With one rank
the group adds a function call, the batch's ``.to(device)`` (a no-op on the learner device) and
the metrics' conversion to floats; this script shows that this is noise beside the step itself.

Workload: PPO's defaults (``rlstruct.algos.ppo``: 20 epochs of minibatches of 256 over a batch
of the default layout's 2 x 8 envs x 32 steps, Adam), a batch collected once by a
``SerialBatcher`` on CartPole-v1 and learned on again and again by two identical models (one
per path, the same seed), one torch thread. Prints the median ms per learn call of each path
and their ratio (group / direct).

Run: ``python benchmarks/local_learner.py [--reps 15] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial

from _common import environment, pin_threads

pin_threads(1)

import torch  # noqa: E402

from rlstruct import SerialBatcher  # noqa: E402
from rlstruct.algos import ppo  # noqa: E402
from rlstruct.blocks.distributions import space_spec  # noqa: E402
from rlstruct.blocks.nets import head_actor_critic  # noqa: E402
from rlstruct.blocks.optim import adam  # noqa: E402
from rlstruct.envs import GymEnvInf  # noqa: E402
from rlstruct.learners.local import LocalLearner  # noqa: E402
from rlstruct.learners.rank import algorithm_learn  # noqa: E402
from rlstruct.runs.run import env_spaces  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    cfg = ppo.Config(anneal_lr=False)
    shape, space = env_spaces(cfg.env_id)
    make = partial(head_actor_critic, shape[0], space_spec(space), cfg.hidden)
    torch.manual_seed(0)
    direct_model, group_model = make(), make()
    group_model.load_state_dict(direct_model.state_dict())
    rows = 2 * cfg.layout.n_envs
    with SerialBatcher(cfg.n_timesteps, ppo.PPOAgent, {"model": make()}, GymEnvInf,
                       {"env": cfg.env_id, "n_envs": rows}, seeds=0) as batcher:
        batcher.reset()
        batcher.execute()
        traj, _ = batcher.get()
    agent = ppo.PPOAgent(direct_model)
    optimizer = adam(direct_model.parameters(), cfg.lr, "cpu", eps=1e-5)
    group = LocalLearner(group_model, partial(adam, lr=cfg.lr, eps=1e-5),
                         partial(algorithm_learn, learn=ppo.learn, make_agent=ppo.PPOAgent,
                                 cfg=cfg), torch.device("cpu"))
    calls = {"direct": lambda: ppo.learn(agent, optimizer, traj.to("cpu"), cfg),
             "group": lambda: group.learn(traj)}
    times: dict[str, list[float]] = {k: [] for k in calls}
    for rep in range(args.reps + 1):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if rep:  # the first rep warms up
                times[name].append((time.perf_counter() - start) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = sorted(g / d for g, d in zip(times["group"], times["direct"]))
    print(f"PPO learn on {traj.n_elems()} x {cfg.n_timesteps} steps, {cfg.n_epochs} epochs "
          f"(median of {args.reps} interleaved reps, one torch thread):")
    print(f"  direct learn(...)          {med['direct']:8.1f} ms")
    print(f"  LocalLearner.learn(batch)  {med['group']:8.1f} ms")
    print(f"  group / direct             {med['group'] / med['direct']:8.3f} "
          f"(paired {paired[0]:.3f}-{paired[-1]:.3f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ms": med, "paired": paired, "environment": environment()}, f, indent=2)


if __name__ == "__main__":
    main()

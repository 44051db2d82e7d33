"""Where a CartPole learner's gradient step goes: APPO's step, part by part, and what was tried.

APPO's learner bounds its speed on 2 cores (docs/algorithms.md, "Where APPO's time goes"): the
workers wait for it, so cores busy stays at about 1 + collection / learning cost per frame. This
script measures, on one torch thread, APPO's own minibatch step (``rlstruct.algos.appo.appo_loss``
on
the default ``MLPActorCritic``, 4 -> 64 -> 64 -> 2 and 1, 256 transitions, ``gradient_step``):

1. the step with ``torch.optim.Adam`` (fused) and with ``rlstruct.learn.optim.FlatAdam`` (APPO's,
   PPO's and IMPALA's now), and the step's parts with FlatAdam: minibatch index, ``appo_loss``
   (and, apart, its first part: the model's forward through ``replay_agent_stateless``),
   zero_grad, backward, clip, update;
2. the element-wise cost of ``torch.tanh`` against ``torch.sigmoid`` and numpy's ``tanh`` on a
   hidden layer's ``(256, 64)`` activations, and tanh's forward and backward against those of
   ``2 sigmoid(2x) - 1`` (the same function from a cheaper operation);
3. APPO's epochs of one segment split into the actor's terms and the critic's (separate nets,
   an optimizer each), run in two threads of one process against one after the other: how
   much of a second core threads put to work despite the GIL. Alone on 2 cores they overlap
   (about 1.5 cores); inside a run, where the workers need the second core too, they did not
   shorten APPO's learn phase (commit fbf888d had it as ``--learner-threads 2``; reverted);
4. with ``--compile``: the same step with the loss under ``torch.compile`` (the first call's
   compile time, then the step; about 20 s the first time on 2 cores).

Usage::

    python benchmarks/learner_step.py                 # ~30 s
    python benchmarks/learner_step.py --compile       # + torch.compile (~40 s more)
    python benchmarks/learner_step.py --json out.json

Figures depend on load: the JSON holds the load average before and after.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common
import numpy as np
import torch

from rlstruct import DictTensor, replay_agent_stateless
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.algos import appo
from rlstruct.learn.nets import MLPActorCritic
from rlstruct.learn.optim import adam, flat_adam, gradient_step

N, MINIBATCH = 1024, 256  # a segment of APPO's default layout: 2 x 16 envs x 32 steps


def _segment() -> DictTensor:
    g = torch.Generator().manual_seed(0)
    return DictTensor({K.OBS_FRAME: torch.randn(N, 4, generator=g),
                       K.STORED_ACTION: torch.randint(0, 2, (N,), generator=g),
                       K.STORED_LOGP: torch.full((N,), -0.69),
                       "advantage": torch.randn(N, generator=g),
                       "target": torch.randn(N, generator=g)})


def _per_call_us(fn: Callable[[], Any], seconds: float) -> float:
    """Median over 5 windows of the microseconds per call of ``fn``."""
    for _ in range(20):
        fn()
    samples = []
    for _ in range(5):
        n, start = 0, time.perf_counter()
        while n == 0 or time.perf_counter() - start < seconds / 5:
            fn()
            n += 1
        samples.append((time.perf_counter() - start) / n * 1e6)
    return _common.summarize(samples)["median"]


def step_cost(make_optimizer: Callable[..., Any], seconds: float,
              loss_fn: Callable[..., Any] = appo.appo_loss) -> float:
    """Microseconds per minibatch step of APPO's loss, epochs of shuffled minibatches."""
    torch.manual_seed(0)
    model, batch, cfg = MLPActorCritic(4, 2, 64), _segment(), appo.Config()
    agent = appo.BehaviourAgent(model)
    optimizer = make_optimizer(model.parameters(), cfg.lr, "cpu", eps=1e-5)

    def epoch() -> None:
        for rows in torch.randperm(N).split(MINIBATCH):
            loss, _ = loss_fn(agent, batch.index(rows), cfg)
            gradient_step(optimizer, loss, cfg.max_grad_norm)

    return _per_call_us(epoch, seconds) / (N // MINIBATCH)


def step_parts(seconds: float) -> dict[str, float]:
    """Microseconds per step in each part of APPO's step with FlatAdam (``gradient_step``'s
    parts timed apart), and the model's forward through ``replay_agent_stateless`` alone (the
    first part of ``appo_loss``)."""
    torch.manual_seed(0)
    model, batch, cfg = MLPActorCritic(4, 2, 64), _segment(), appo.Config()
    agent = appo.BehaviourAgent(model)
    optimizer = flat_adam(model.parameters(), cfg.lr, "cpu", eps=1e-5)
    spent: dict[str, float] = {}

    def step(rows: torch.Tensor) -> None:
        clock = [time.perf_counter()]

        def tick(name: str) -> None:
            now = time.perf_counter()
            spent[name] = spent.get(name, 0.0) + now - clock[0]
            clock[0] = now

        mb = batch.index(rows)
        tick("index the minibatch")
        loss, _ = appo.appo_loss(agent, mb, cfg)
        tick("appo_loss (forward and loss terms)")
        optimizer.zero_grad()
        tick("zero_grad")
        loss.backward()
        tick("backward")
        optimizer.clip_grad_norm_(cfg.max_grad_norm)
        tick("clip")
        optimizer.step()
        tick("update (FlatAdam)")

    n_steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for rows in torch.randperm(N).split(MINIBATCH):
            step(rows)
            n_steps += 1
    parts = {k: v / n_steps * 1e6 for k, v in spent.items()}
    mb = batch.index(torch.arange(MINIBATCH))
    parts["of appo_loss: the forward alone"] = _per_call_us(
        lambda: replay_agent_stateless(agent, mb), seconds / 4)
    return parts


def activations(seconds: float) -> dict[str, float]:
    """Microseconds per call on a ``(256, 64)`` float32 tensor; then forward and backward of
    ``tanh`` and of the same function as ``2 sigmoid(2x) - 1``."""
    x = torch.randn(MINIBATCH, 64)
    xn = x.numpy()
    xg = x.clone().requires_grad_()

    def both(fn: Callable[[torch.Tensor], torch.Tensor]) -> float:
        return _per_call_us(lambda: fn(xg).sum().backward(), seconds)

    return {"torch.tanh": _per_call_us(lambda: torch.tanh(x), seconds),
            "torch.sigmoid": _per_call_us(lambda: torch.sigmoid(x), seconds),
            "numpy tanh": _per_call_us(lambda: np.tanh(xn), seconds),
            "torch.relu": _per_call_us(lambda: torch.relu(x), seconds),
            "tanh, forward and backward": both(torch.tanh),
            "2 sigmoid(2x) - 1, forward and backward": both(
                lambda v: torch.sigmoid(2 * v) * 2 - 1)}


def two_threads(seconds: float) -> dict[str, float]:
    """Wall ms and cores per segment: APPO's epochs split into the actor's terms and the
    critic's (separate nets, a FlatAdam each, the same minibatches), in turn vs in two threads
    of this process."""
    torch.manual_seed(0)
    model, batch, cfg = MLPActorCritic(4, 2, 64), _segment(), appo.Config()
    obs, act, old = batch[K.OBS_FRAME], batch[K.STORED_ACTION], batch[K.STORED_LOGP]
    actor_opt = flat_adam(model.actor.parameters(), cfg.lr, "cpu", eps=1e-5)
    critic_opt = flat_adam(model.critic.parameters(), cfg.lr, "cpu", eps=1e-5)

    def actor(orders: list[torch.Tensor]) -> None:
        for order in orders:
            for rows in order.split(MINIBATCH):
                logp = F.categorical_log_prob(model.actor(obs[rows]), act[rows])
                adv = F.normalize_advantages(batch["advantage"][rows])
                loss = F.clipped_surrogate(logp, old[rows], adv, cfg.clip_coef).mean()
                gradient_step(actor_opt, loss, cfg.max_grad_norm)

    def critic(orders: list[torch.Tensor]) -> None:
        for order in orders:
            for rows in order.split(MINIBATCH):
                v = model.critic(obs[rows]).squeeze(-1)
                loss = cfg.vf_coef * 0.5 * (v - batch["target"][rows]).square().mean()
                gradient_step(critic_opt, loss, cfg.max_grad_norm)

    def in_turn() -> None:
        orders = [torch.randperm(N) for _ in range(cfg.n_epochs)]
        actor(orders)
        critic(orders)

    def in_threads() -> None:
        orders = [torch.randperm(N) for _ in range(cfg.n_epochs)]
        other = threading.Thread(target=critic, args=(orders,), daemon=True)
        other.start()
        actor(orders)
        other.join(timeout=60)

    out = {}
    for name, fn in (("in turn", in_turn), ("two threads", in_threads)):
        fn()
        wall, cpu, n = time.perf_counter(), time.process_time(), 0
        while time.perf_counter() - wall < seconds:
            fn()
            n += 1
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        out[f"{name} ms/segment"] = wall / n * 1e3
        out[f"{name} cores"] = cpu / wall
    return out


def compiled(seconds: float) -> dict[str, float]:
    """The step with ``appo_loss`` under ``torch.compile``: compile seconds, then us per step."""
    loss_fn = torch.compile(appo.appo_loss, dynamic=False)
    start = time.perf_counter()
    step_cost(flat_adam, 0.0, loss_fn)  # the first calls compile
    first = time.perf_counter() - start
    return {"compile and first epoch s": first,
            "step us": step_cost(flat_adam, seconds, loss_fn)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    _common.pin_threads(1)
    load_before = os.getloadavg()
    results: dict[str, Any] = {
        "step us": {"torch.optim.Adam (fused)": step_cost(adam, args.seconds),
                    "FlatAdam": step_cost(flat_adam, args.seconds)},
        "FlatAdam step parts us": step_parts(args.seconds),
        "activation us (256 x 64)": activations(args.seconds / 4),
        "actor and critic epochs of a segment": two_threads(args.seconds),
    }
    if args.compile:
        results["torch.compile"] = compiled(args.seconds)
    results["environment"] = _common.environment(load_before=load_before,
                                                 load_after=os.getloadavg())
    for section, values in results.items():
        if section == "environment":
            continue
        print(section)
        for k, v in values.items():
            print(f"  {k:38s} {v:9.1f}")
    step = sum(v for k, v in results["FlatAdam step parts us"].items() if not k.startswith("of "))
    print(f"(the step's parts sum to {step:.1f} us)")
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

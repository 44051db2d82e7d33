"""Learner scaling: samples/s through PPO's update with the Nature CNN, 1 vs 2 learner ranks.

Three measurements in one run, each rank with one torch thread (gloo on the CPU; NCCL on GPUs
with ``--device cuda``):

1. ``LearnerGroup`` with 1 and 2 ranks on PPO's own loss (``rlstruct.algos.ppo.ppo_loss``,
   ``CNNActorCritic`` on uint8 84x84x4 frames): each update is one pass over a batch of
   ``--batch`` transitions in global minibatches of ``--minibatch`` (split over the ranks), Adam.
   Batches are submitted one ahead (staged while the previous one is learned), as a pipelined
   training loop does. Reports samples/s (transitions through forward+backward per second), the
   2-rank / 1-rank ratio, and per update: load-wait, learn and all-reduce ms.
2. Bare DDP loops (``DistributedDataParallel``, gloo, batch ``--minibatch``, Adam) with 1 and 2
   processes: cross-entropy on the same CNN (the issue's reference), and PPO's own loss on the
   same ``CNNActorCritic`` (the ceiling the group's machinery is held to: the same work, without
   the group).
3. The ratio group / bare DDP on PPO's loss for each rank count (the machinery's cost).

Targets (issue 20): 2 ranks >= 1.8x 1 rank; load-wait <= 5 % of learn time with staging. Only
meaningful on an idle machine: the JSON holds the load average (``os.getloadavg``) before and
after; figures taken above 1.5 are under load.

Usage::

    python benchmarks/learner_scaling.py              # ~2 min on 2 idle cores
    python benchmarks/learner_scaling.py --quick      # smoke run
    python benchmarks/learner_scaling.py --json out.json
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import environment, pin_threads
from rlstruct import DictTensor
from rlstruct import keys as K
from rlstruct.algos import ppo
from rlstruct.blocks.nets import CNNActorCritic, nature_cnn
from rlstruct.learners.group import LearnerGroup, free_port
from rlstruct.parallel.context import worker_context

N_ACTIONS = 6
CFG = ppo.Config(adv_norm="minibatch", max_grad_norm=0.5)


def make_model() -> nn.Module:
    return CNNActorCritic(N_ACTIONS, in_channels=4)


def make_adam(params, device=None) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=2.5e-4, eps=1e-5)


def ppo_update(ctx, batch: DictTensor, minibatch: int) -> dict[str, float]:
    """One pass of PPO's update over the rank's shard in minibatches of ``minibatch / ranks``."""
    agent = ppo.PPOAgent(ctx.model)
    local = minibatch // ctx.world_size
    for rows in torch.randperm(batch.n_elems()).split(local):
        loss, _ = ppo.ppo_loss(agent, batch.index(rows), CFG)
        ctx.step(ctx.optimizer, loss, CFG.max_grad_norm)
    return {}


def make_batch(n: int, seed: int) -> DictTensor:
    g = torch.Generator().manual_seed(seed)
    return DictTensor({
        K.OBS_FRAME: torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8, generator=g),
        K.STORED_SAMPLE: torch.randint(0, N_ACTIONS, (n,), generator=g),  # the action taken
        K.STORED_LOGP: torch.full((n,), -1.79),
        K.STORED_VALUE: torch.randn(n, generator=g),
        "advantage": torch.randn(n, generator=g),
        "return": torch.randn(n, generator=g),
    })


def bench_group(n_ranks: int, args: argparse.Namespace) -> dict[str, float]:
    from functools import partial

    devices = ([f"cuda:{k}" for k in range(n_ranks)] if args.device == "cuda"
               else ["cpu"] * n_ranks)
    batches = [make_batch(args.batch, s) for s in range(2)]
    model = make_model()
    learn = partial(ppo_update, minibatch=args.minibatch)
    rows = []
    with LearnerGroup(make_model, make_adam, learn, model.state_dict(), n_learners=n_ranks,
                      devices=devices, n_threads=1, timeout=600) as group:
        group.learn(batches[0])  # start-up and first-touch costs
        group.submit(batches[1])
        start = time.perf_counter()
        for k in range(args.updates):
            if k + 1 < args.updates:
                group.submit(batches[k % 2])  # staged while the previous batch is learned
            rows.append(group.collect())
        elapsed = time.perf_counter() - start
    mean = {key: sum(r[key] for r in rows) / len(rows)
            for key in ("load_wait_ms", "rank_learn_ms", "allreduce_ms")}
    return {"ranks": n_ranks, "samples_per_s": args.batch * args.updates / elapsed, **mean,
            "load_wait_fraction": mean["load_wait_ms"] / mean["rank_learn_ms"]}


class _DDPActorCritic(nn.parallel.DistributedDataParallel):
    """DDP around ``CNNActorCritic`` that shows the wrapped model's policy head, as PPO's loss
    reads ``agent.model.head``."""

    @property
    def head(self) -> nn.Module:
        return self.module.head


def _ddp_rank(rank: int, world: int, port: int, args: argparse.Namespace, loss_name: str,
              out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    local = args.minibatch // world
    if loss_name == "ppo":  # the group's work without the group
        net = _DDPActorCritic(make_model())
        agent, batch = ppo.PPOAgent(net), make_batch(local, rank)

        def compute_loss() -> torch.Tensor:
            return ppo.ppo_loss(agent, batch, CFG)[0]
    else:  # the reference: cross-entropy on the same CNN
        net = nn.parallel.DistributedDataParallel(
            nn.Sequential(nature_cnn(4), nn.Linear(512, N_ACTIONS)))
        x = torch.randint(0, 256, (local, 4, 84, 84), dtype=torch.uint8)
        y = torch.randint(0, N_ACTIONS, (local,))

        def compute_loss() -> torch.Tensor:
            return nn.functional.cross_entropy(net(x.float() / 255.0), y)
    optimizer = make_adam(net.parameters())
    steps = args.batch * args.updates // args.minibatch
    for k in range(steps + 2):
        if k == 2:  # after the warm-up steps
            dist.barrier()
            start = time.perf_counter()
        loss = compute_loss()
        optimizer.zero_grad()
        loss.backward()
        if loss_name == "ppo":
            nn.utils.clip_grad_norm_(net.parameters(), CFG.max_grad_norm)
        optimizer.step()
    dist.barrier()
    if rank == 0:
        out.put(args.minibatch * steps / (time.perf_counter() - start))
    dist.destroy_process_group()


def bench_ddp(n_ranks: int, args: argparse.Namespace, loss_name: str) -> dict[str, float]:
    ctx = worker_context(start=True)
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_ddp_rank, args=(r, n_ranks, port, args, loss_name, out))
             for r in range(n_ranks)]
    for p in procs:
        p.start()
    try:
        rate = out.get(timeout=600)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
        out.close()
        out.join_thread()
    return {"ranks": n_ranks, "samples_per_s": rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (tiny budgets)")
    parser.add_argument("--batch", type=int, default=1024, help="transitions per update")
    parser.add_argument("--minibatch", type=int, default=256, help="global minibatch")
    parser.add_argument("--updates", type=int, default=6, help="timed updates per rank count")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.minibatch, args.updates = 64, 32, 2
    pin_threads(1)
    load_before = os.getloadavg()
    ranks = (1, 2) if args.device == "cpu" or torch.cuda.device_count() >= 2 else (1,)
    group = {n: bench_group(n, args) for n in ranks}
    ddp = {n: bench_ddp(n, args, "ppo") for n in ranks} if args.device == "cpu" else {}
    ddp_ce = {n: bench_ddp(n, args, "ce") for n in ranks} if args.device == "cpu" else {}
    result = {
        "group": list(group.values()), "ddp": list(ddp.values()), "ddp_ce": list(ddp_ce.values()),
        "load_before": load_before, "load_after": os.getloadavg(),
        "environment": environment(batch=args.batch, minibatch=args.minibatch,
                                   updates=args.updates, device=args.device),
    }
    print(f"{'ranks':>5} {'group samples/s':>16} {'DDP, PPO loss':>14} {'group/DDP':>10} "
          f"{'DDP, CE':>8} {'load-wait ms':>13} {'learn ms':>9} {'all-reduce ms':>14}")
    for n in ranks:
        g, d = group[n], ddp.get(n, {}).get("samples_per_s", float("nan"))
        ce = ddp_ce.get(n, {}).get("samples_per_s", float("nan"))
        print(f"{n:>5} {g['samples_per_s']:>16.1f} {d:>14.1f} {g['samples_per_s'] / d:>10.2f} "
              f"{ce:>8.1f} "
              f"{g['load_wait_ms']:>13.1f} {g['rank_learn_ms']:>9.1f} "
              f"{g['allreduce_ms']:>14.1f}")
    if len(ranks) == 2:
        result["group_ratio_2v1"] = group[2]["samples_per_s"] / group[1]["samples_per_s"]
        print(f"2 ranks / 1 rank: group {result['group_ratio_2v1']:.2f}x", end="")
        if ddp:
            result["ddp_ratio_2v1"] = ddp[2]["samples_per_s"] / ddp[1]["samples_per_s"]
            result["ddp_ce_ratio_2v1"] = ddp_ce[2]["samples_per_s"] / ddp_ce[1]["samples_per_s"]
            print(f", bare DDP on PPO's loss {result['ddp_ratio_2v1']:.2f}x, on cross-entropy "
                  f"{result['ddp_ce_ratio_2v1']:.2f}x", end="")
        print()
    loads = (*load_before, *result["load_after"])
    print(f"load average before {load_before[0]:.2f}, after {result['load_after'][0]:.2f}"
          + (" (under load: to be re-measured)" if max(loads[:1] + loads[3:4]) > 1.5 else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

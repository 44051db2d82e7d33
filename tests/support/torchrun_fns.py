"""A two-process torchrun world started by hand (the variables torchrun sets), for the fault
tests of rlstruct.learners.torchrun: ``python tests/support/torchrun_fns.py FAULT`` with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` set. Rank 0 learns three toy
batches and prints ``OK <replica_spread>`` or ``ERROR <type> rank=<rank> <message>``; rank 1
serves, and misbehaves on batch 1 as FAULT says (``none``, ``die``, ``raise``, ``hang``)."""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn

from rlstruct import DictTensor
from rlstruct.errors import LearnerError, LearnerTimeoutError
from rlstruct.learners.torchrun import TorchrunLearnerGroup, serve_rank, torchrun_rank


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def make_optimizer(params, device=None) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1)


def learn(ctx, batch: DictTensor, fault: str = "none", index: int = 0) -> dict[str, float]:
    if ctx.rank == 1 and index == 1:
        if fault == "die":
            os._exit(3)
        if fault == "raise":
            raise ValueError("a bad batch on rank 1")
        if fault == "hang":
            time.sleep(600)
    loss = (ctx.model(batch["x"]).squeeze(-1) - batch["y"]).square().mean()
    ctx.step(ctx.optimizer, loss, 0.0)
    return {"loss": float(loss.detach())}


def main(fault: str) -> None:
    if torchrun_rank() > 0:
        serve_rank("cpu", timeout=60)
    torch.manual_seed(0)
    model = make_model()
    with TorchrunLearnerGroup(make_model, make_optimizer, learn, model.state_dict(),
                              timeout=3.0, start_timeout=60) as group:
        try:
            for index in range(3):
                batch = DictTensor({"x": torch.randn(16, 4), "y": torch.randn(16)})
                metrics = group.learn(batch, fault=fault, index=index)
        except (LearnerError, LearnerTimeoutError) as err:
            rank = getattr(err, "rank", None) or getattr(err, "ranks", None)
            print(f"ERROR {type(err).__name__} rank={rank} {err}", flush=True)
            return
    print(f"OK {metrics['replica_spread']} {metrics['rows_per_rank']}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

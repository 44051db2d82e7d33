"""The ranks > 0 of a learner group under ``torchrun`` (:func:`serve_rank`), and the world that
every rank, rank 0 too, joins (:func:`join_world`) and the parts both sides share: the replica
that learns on a rank's rows (:class:`Replica`) and how those rows travel (:func:`to_bytes`,
:func:`from_bytes`).

Rank 0's side, the driver's :class:`~rlstruct.learners.torchrun.TorchrunLearnerGroup`, and the
protocol between them are described in :mod:`rlstruct.learners.torchrun`. A rank > 0 beats a
heartbeat counter in the store every :data:`BEAT_S`, writes its phase there, and its traceback
when it raises; it ignores SIGINT, and SIGTERM for :data:`SIGTERM_GRACE_S`.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlstruct.errors import ConfigError
from rlstruct.learners.rank import RankContext, _as_metrics
from rlstruct.learners.staging import unpack

__all__ = ["serve_rank", "torchrun_rank", "torchrun_world", "join_world", "Replica",
           "SIGTERM_GRACE_S", "BEAT_S"]

#: Heartbeat period of ranks > 0 (seconds).
BEAT_S = 0.25
_ORPHAN_GRACE_S = 2.0  # a rank whose store is gone exits after this, unless it stopped
_IDLE_S = 24 * 3600.0  # how long ranks > 0 wait for rank 0's next batch (it may evaluate...)
#: Seconds a rank > 0 keeps serving after a SIGTERM (rank 0 stops it before; torchrun's agent
#: sends SIGKILL 30 s after its SIGTERM).
SIGTERM_GRACE_S = 25.0


def torchrun_world() -> int:
    """``WORLD_SIZE`` (1 when unset: not under torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def torchrun_rank() -> int:
    """``RANK`` under torchrun (``WORLD_SIZE`` > 1), else 0.

    Raises:
        ConfigError: ``WORLD_SIZE`` > 1 without the other variables torchrun sets.
    """
    if torchrun_world() <= 1:
        return 0
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {missing} are not set: "
                          "start the processes with torchrun (or set all of them)")
    return int(os.environ["RANK"])


def local_device(device_type: str) -> torch.device:
    """This process's learner device: ``cuda:LOCAL_RANK`` for ``"cuda"``, else the CPU."""
    if device_type == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def join_world(rank: int, world: int, device: torch.device, timeout: float | None,
          start_timeout: float) -> tuple[Any, Any, Any]:
    """Joins torchrun's world: ``(store, control group, data group)``; the default group
    (NCCL on CUDA, else gloo) carries the gradients. Ranks > 0 wait up to ``start_timeout``
    for rank 0 (which starts its batcher first); collectives then fail after rank 0's
    ``timeout`` (None on ranks > 0: they read it from the store)."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent,
                          timeout=timedelta(seconds=start_timeout))
    if rank == 0:
        store.set("rlstruct/timeout", str(timeout))
    else:
        store.wait(["rlstruct/timeout"], timedelta(seconds=start_timeout))
        timeout = float(store.get("rlstruct/timeout").decode())
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore("rlstruct/pg", store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout))
    control = dist.new_group(backend="gloo", timeout=timedelta(seconds=_IDLE_S))
    data = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
    return dist.PrefixStore("rlstruct/health", store), control, data


def _checksum(model: nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.detach().double().sum().item() for p in model.parameters()))


def to_bytes(tensors: Mapping[str, Tensor]) -> Tensor:
    """``tensors`` as one flat uint8 CPU tensor, in order (what one rank's rows travel as)."""
    return torch.cat([v.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                      for v in tensors.values()])


def from_bytes(buffer: Tensor, specs: dict[str, tuple[tuple[int, ...], torch.dtype]]
                ) -> dict[str, Tensor]:
    """The tensors of :func:`to_bytes`'s ``buffer``, given ``{key: (shape, dtype)}`` in
    order (views of ``buffer``)."""
    out, start = {}, 0
    for k, (shape, dtype) in specs.items():
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        out[k] = buffer[start:start + n].view(dtype).reshape(shape)
        start += n
    return out


class Replica:
    """One rank's model, optimizer and context, and its learn step on a received shard."""

    def __init__(self, spec: bytes, rank: int, world: int, store: Any) -> None:
        make_model, make_optimizer, learn, init_state, device_type, bucket = \
            cloudpickle.loads(spec)
        self.device = local_device(device_type)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.model = make_model().to(self.device)
        self.model.load_state_dict(init_state)
        self.optimizer = make_optimizer(self.model.parameters(), device=self.device)
        self.ctx = RankContext(rank, world, self.device, self.model, self.optimizer,
                               bucket_bytes=bucket)
        self.learn, self.rank, self.store = learn, rank, store

    def load(self, state: Mapping[str, Tensor] | None, optimizer_state: dict | None) -> None:
        """Loads weights and/or an optimizer state (a resume; the same on every rank)."""
        if state is not None:
            self.model.load_state_dict(state)
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)

    def step(self, index: int, kind: str, shard: dict[str, Tensor], kwargs: dict) -> tuple:
        """Learns on the shard; returns ``(metrics, timings, checksum, rows)``."""
        self.store.set(f"phase/{self.rank}", f"learning batch {index}")
        tensors = {k: v.to(self.device, non_blocking=True) for k, v in shard.items()}
        self.ctx.allreduce_ms, self.ctx.n_allreduce = 0.0, 0
        start = time.perf_counter()
        metrics = _as_metrics(self.learn(self.ctx, unpack(kind, tensors), **kwargs))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        timings = {"rank_learn_ms": (time.perf_counter() - start) * 1e3,
                   "allreduce_ms": self.ctx.allreduce_ms,
                   "n_allreduce": float(self.ctx.n_allreduce)}
        self.store.set(f"phase/{self.rank}", f"idle after batch {index}")
        rows = int(next(iter(shard.values())).shape[0])
        return metrics, timings, _checksum(self.model), rows


def serve_rank(device_type: str = "cpu", timeout: float = 1800.0) -> None:
    """The body of a torchrun process with ``RANK > 0``: joins the world, receives the
    algorithm's factories from rank 0, then learns on its rows of every batch rank 0 scatters
    until rank 0 says stop. Exits the process: 0 after stop, 1 after an error (whose traceback
    rank 0 reads from the store).

    Args:
        device_type: the learner device's type, ``cpu`` or ``cuda`` (then ``cuda:LOCAL_RANK``).
        timeout: seconds to wait for rank 0 to create its group (it starts its batcher first).
    """
    rank, world = torchrun_rank(), torchrun_world()
    store = None
    stop = threading.Event()
    code = 0
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: rank 0 decides, then says stop
    signal.signal(signal.SIGTERM, _exit_later)
    try:
        store, control, data = join_world(rank, world, local_device(device_type), None, timeout)
        store.set(f"pid/{rank}", f"{os.getpid()} on {socket.gethostname()}")
        # Its own client with a short timeout: a lost store is noticed in seconds.
        beat_store = dist.PrefixStore("rlstruct/health", dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=timedelta(seconds=_ORPHAN_GRACE_S)))
        beat = threading.Thread(target=_heartbeat, args=(beat_store, rank, stop), daemon=True,
                                name=f"rlstruct-rank{rank}-heartbeat")
        beat.start()
        message: list[Any] = [None]
        dist.broadcast_object_list(message, src=0, group=control)
        replica = Replica(message[0], rank, world, store)
        while True:
            store.set(f"phase/{rank}", "waiting for a batch")
            header: list[Any] = [None]
            dist.broadcast_object_list(header, src=0, group=control)
            if header[0][0] == "stop":
                break
            if header[0][0] == "load":  # a resume: every rank loads what rank 0 loads
                replica.load(*header[0][1:])
                dist.barrier(group=data)
                continue
            _, index, kind, specs, kwargs = header[0]
            size = sum(math.prod(s) * torch.empty((), dtype=d).element_size()
                       for s, d in specs.values())
            buffer = torch.empty(size, dtype=torch.uint8)
            dist.scatter(buffer, None, src=0, group=data)
            answer = replica.step(index, kind, from_bytes(buffer, specs), kwargs)
            dist.gather_object(answer, None, dst=0, group=data)
    except BaseException as exc:  # noqa: BLE001 - told to rank 0 and printed; the rank exits 1
        code = 1
        if store is not None:
            with contextlib.suppress(Exception):  # rank 0's store gone: the traceback is printed
                store.set(f"error/{rank}", "".join(traceback.format_exception(exc)))
        traceback.print_exc()
    finally:
        stop.set()
        if dist.is_initialized():
            with contextlib.suppress(Exception):  # a broken group: the exit code says why
                dist.destroy_process_group()
    raise SystemExit(code)


def _exit_later(signum: int, frame: Any) -> None:
    """A rank > 0's SIGTERM: rank 0 (signalled too) finishes its batch with this rank and then
    says stop; should it not, the process ends after :data:`SIGTERM_GRACE_S`."""
    timer = threading.Timer(SIGTERM_GRACE_S, os._exit, args=(128 + signum,))
    timer.daemon = True
    timer.start()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _heartbeat(store: Any, rank: int, stop: threading.Event) -> None:
    """Beats until ``stop``; a rank whose store (rank 0's, or torchrun's agent) is gone ends its
    own process after a grace period, even when its main thread hangs in ``learn``."""
    while not stop.wait(BEAT_S):
        try:
            store.add(f"beat/{rank}", 1)
        except Exception:  # noqa: BLE001 - the store is gone: this rank is an orphan, it leaves
            if not stop.wait(_ORPHAN_GRACE_S):
                os._exit(1)
            return

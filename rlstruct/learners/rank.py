"""One rank of a learner group: its process body and the :class:`RankContext` that the
algorithm's learn function receives.

A rank joins the process group (gloo on the CPU, NCCL on CUDA devices), builds its replica of the
model with the algorithm's factory, loads the group's initial weights and then, batch after batch:

1. its loader thread copies the next shard from shared memory onto the rank's device
   (:class:`~rlstruct.learners.staging.DeviceStager`) while the main thread still learns on the
   previous
   one, and says ``loaded`` (the driver may then reuse the slot);
2. the main thread calls ``learn(ctx, shard, **kwargs)``; every gradient step of ``learn`` goes
   through :meth:`RankContext.step`, which averages the gradients over the ranks (one flattened
   all-reduce per bucket, :mod:`rlstruct.learners.reducer`) before clipping and stepping, so
   every replica takes the same step;
3. rank 0 copies the new weights into the group's shared-memory publication slot, and every rank
   answers ``done`` with its metrics and timings.

A rank ignores SIGINT and SIGTERM, like the batcher workers ignore SIGINT: Ctrl-C to the process
group (or Slurm's SIGTERM to every process of a job step) reaches the driver only, which finishes
the batch in flight, checkpoints and then stops the ranks itself (stop, then SIGKILL).

An exception anywhere is sent to the driver with its traceback, naming the rank (and whether it
was raised inside a collective, i.e. most likely caused by another rank). The rank writes what it
is doing (batch, phase, since when) into a shared status table, which the driver reads to name a
hung rank when its deadline passes.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlstruct.blocks.optim import Optimizer, gradient_step
from rlstruct.devices import learner_autocast
from rlstruct.learners.reducer import BUCKET_BYTES, GradientReducer
from rlstruct.learners.staging import DeviceStager, unpack
from rlstruct.parallel.startup import ignore_ctrl_c, watch_driver

__all__ = ["RankContext", "algorithm_learn"]

#: The phases of the status table (column 1), by code.
PHASES = ("idle", "learn", "all-reduce", "publish")
_IDLE, _LEARN, _COLLECTIVE, _PUBLISH = range(4)


@dataclass
class RankSpec:
    """What every rank is started with (picklable; the factories travel as cloudpickle bytes).

    Attributes:
        factories: cloudpickle of ``(make_model, make_optimizer, learn)``.
        devices: one device name per rank.
        backend: ``"gloo"`` or ``"nccl"``.
        init_method: the rendezvous, ``tcp://addr:port``.
        seed: ``torch.manual_seed`` of every rank before the model is built.
        n_threads: torch threads per rank.
        pg_timeout: seconds a collective may wait for a peer before it fails.
        bucket_bytes: gradient bytes per all-reduce bucket.
        optimizer_state: ``torch.save`` of an optimizer state to start from (a resume), or
            None.
    """

    factories: bytes
    devices: list[str]
    backend: str
    init_method: str
    seed: int
    n_threads: int
    pg_timeout: float
    bucket_bytes: int = BUCKET_BYTES
    optimizer_state: bytes | None = None


class RankContext:
    """What ``learn(ctx, shard, **kwargs)`` gets on each rank.

    Attributes:
        rank: this rank, ``0 <= rank < world_size``.
        world_size: the number of ranks.
        device: this rank's device (the shard is already on it).
        model: this rank's replica (identical on every rank after every step); None in the
            one-rank stand-in of :meth:`of`.
        optimizer: this rank's optimizer over ``model``'s parameters (None likewise).

    Beyond :meth:`step`, an update that is not an averaged gradient step (TRPO's) uses
    :meth:`all_reduce_mean` (gradients, Fisher-vector products, losses, statistics) and
    :meth:`all_gather_rows` (what must be computed from the whole batch's rows); both count in
    ``n_allreduce`` and ``allreduce_ms``.
    """

    def __init__(
        self, rank: int, world_size: int, device: torch.device, model: nn.Module | None = None,
        optimizer: Optimizer | None = None, status: Tensor | None = None,
        bucket_bytes: int = BUCKET_BYTES,
    ) -> None:
        self.rank, self.world_size, self.device = rank, world_size, device
        self.model, self.optimizer = model, optimizer
        self._status = status
        self._reducer = (GradientReducer(list(model.parameters()), bucket_bytes)
                         if world_size > 1 and model is not None else None)
        self.allreduce_ms = 0.0
        self.n_allreduce = 0
        self.in_collective = False

    def step(
        self, optimizer: Optimizer, loss: Tensor, max_grad_norm: float
    ) -> Tensor | None:
        """:func:`rlstruct.blocks.optim.gradient_step` with the gradients averaged over the ranks:
        ``zero_grad``, ``backward``, all-reduce mean, clip the global norm (0: no clipping),
        ``step``. Every rank must call it the same number of times per batch.

        Returns:
            The global norm of the averaged gradient before clipping, or None without clipping.
        """
        # Buckets are all-reduced as backward fills them (armed before, awaited after).
        return gradient_step(optimizer, loss, max_grad_norm,
                             around_backward=(self._arm, self.average_gradients))

    def _arm(self) -> None:
        if self._reducer is not None:
            self._reducer.arm()

    def average_gradients(self) -> None:
        """Replaces every gradient of ``model`` by its mean over the ranks; nothing at all with
        one rank, which keeps it bitwise equal to a single learner.

        Inside :meth:`step` the buckets (consecutive gradients, last layers first, up to about
        25 MB, flattened) were already all-reduced asynchronously as backward filled them, like
        DDP; this waits for them (and reduces what backward left, after a plain ``backward``).
        ``allreduce_ms`` counts the time spent here: the communication backward did not hide.
        """
        if self._reducer is None:
            return
        start = time.perf_counter()
        self._set_status(_COLLECTIVE)
        self.in_collective = True
        self._reducer.finish(self.world_size)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # honest all-reduce timings
        self.in_collective = False
        self._set_status(_LEARN)
        self.n_allreduce += 1
        self.allreduce_ms += (time.perf_counter() - start) * 1e3

    # ------------------------------------------------ collectives beyond gradient averaging
    @staticmethod
    def of(step: Callable[..., Any] | None = None) -> RankContext:
        """The context a learn function was handed through its ``step`` argument
        (:func:`algorithm_learn` passes ``ctx.step``); for any other step function (a learner
        without a group: ``gradient_step``) a context of one rank, whose collectives return
        their inputs untouched (also ``RankContext.of()``). A learn function then reads the
        same with or without a group.

        Examples:
            >>> from rlstruct.blocks.optim import gradient_step
            >>> ctx = RankContext.of(gradient_step)
            >>> x = torch.ones(2)
            >>> ctx.world_size, ctx.all_reduce_mean(x)[0] is x, ctx.all_gather_rows(x) is x
            (1, True, True)
        """
        ctx = getattr(step, "__self__", None)
        return ctx if isinstance(ctx, RankContext) else RankContext(0, 1, torch.device("cpu"))

    def all_reduce_mean(self, *tensors: Tensor, weight: float | None = None) -> tuple[Tensor, ...]:
        """The mean over the ranks of each tensor (each the same shape on every rank), in one
        all-reduce; with ``weight`` (e.g. this rank's number of rows) the weighted mean
        ``sum_r w_r t_r / sum_r w_r``, i.e. a mean over the whole batch's rows when each
        tensor is a mean over the rank's rows. Every rank must call it the same number of
        times, in the same order. One rank: the tensors themselves (bitwise a single learner).

        Args:
            *tensors: floating tensors on :attr:`device`; reduced in float64, returned in their
                own dtype.
            weight: this rank's weight (> 0), or None for the plain mean.

        Returns:
            The means, in the order given.
        """
        if self.world_size == 1:
            return tensors
        w = 1.0 if weight is None else float(weight)
        flat = torch.cat([t.detach().reshape(-1).double() * w for t in tensors]
                         + [torch.full((1,), w, dtype=torch.float64, device=self.device)])
        with self._collective():
            dist.all_reduce(flat)
        flat = flat[:-1] / flat[-1]
        views = flat.split([t.numel() for t in tensors])
        return tuple(v.view_as(t).to(t.dtype) for v, t in zip(views, tensors))

    def all_gather_rows(self, x: Tensor) -> Tensor:
        """The ranks' ``x`` ``(n_r, *feat)`` concatenated along dim 0 in rank order: the whole
        batch's rows (rank ``r`` holds the ``r``-th block of rows), on every rank. The ranks
        may hold different numbers of rows (two collectives then: the counts, the rows). One
        rank: ``x`` itself.

        Returns:
            ``(sum_r n_r, *feat)``.
        """
        if self.world_size == 1:
            return x
        with self._collective():
            counts = [torch.zeros(1, dtype=torch.int64, device=self.device)
                      for _ in range(self.world_size)]
            dist.all_gather(counts, torch.tensor([x.shape[0]], device=self.device))
            sizes = [int(c) for c in counts]
            padded = x.new_zeros((max(sizes), *x.shape[1:]))
            padded[:x.shape[0]] = x
            parts = [torch.empty_like(padded) for _ in range(self.world_size)]
            dist.all_gather(parts, padded.contiguous())
        return torch.cat([p[:n] for p, n in zip(parts, sizes)])

    @contextlib.contextmanager
    def _collective(self) -> Any:
        """Status, ``in_collective`` and the all-reduce counters around one collective."""
        start = time.perf_counter()
        self._set_status(_COLLECTIVE)
        self.in_collective = True
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.in_collective = False
        self._set_status(_LEARN)
        self.n_allreduce += 1
        self.allreduce_ms += (time.perf_counter() - start) * 1e3

    def _set_status(self, phase: int, batch: int | None = None) -> None:
        if self._status is None:
            return
        row = self._status[self.rank]
        if batch is not None:
            row[0] = batch
        row[1], row[2], row[3] = phase, time.time(), self.n_allreduce


def algorithm_learn(
    ctx: RankContext, batch: Any, *, learn: Callable[..., Mapping[str, float]],
    make_agent: Callable[[nn.Module], Any] | None, cfg: Any, per_rank: tuple[str, ...] = (),
    lr: float | None = None, stacked: bool = False, out_of_time: Callable[[], bool] | None = None,
    precision: str = "fp32",
) -> Mapping[str, float]:
    """Runs an algorithm's ``learn(agent, optimizer, batch, cfg, step)`` on one rank, with
    ``step=ctx.step`` (gradients averaged over the ranks); bind the keywords with
    ``functools.partial`` to get a group's learn function.

    Args:
        ctx: the rank's context.
        batch: the rank's rows of the batch, on its device.
        learn: the algorithm's learn function; every gradient step goes through ``step``.
        make_agent: ``make_agent(ctx.model)``, the agent the loss replays (None: the model).
        cfg: the algorithm's config.
        per_rank: integer fields of ``cfg`` divided by the number of ranks on each rank (e.g.
            ``minibatch_size``: the global minibatch keeps its size, and so the step count).
        lr: the learning rate of this batch (annealing), if it changes.
        stacked: the batch holds ``k`` minibatches stacked as ``(n, k, *feat)`` (an off-policy
            learner's ``k`` replay samples, ``DictTensor.stack(samples, dim=1)``): ``learn``
            runs once on the rank's rows of each, in order; the last one's metrics are returned.
        out_of_time: handed to ``learn`` as ``out_of_time=`` (a learn function that stops
            between minibatches once the run's time is up); only a one-rank learner in the run's
            own process has it, since ranks must take the same number of steps.
        precision: ``"fp32"``, ``"bf16"`` or ``"auto"``: the learn step runs in
            :func:`~rlstruct.devices.learner_autocast` on the rank's device.
    """
    if lr is not None:
        for group in ctx.optimizer.param_groups:
            group["lr"] = lr
    if per_rank:
        cfg = copy.copy(cfg)
        for name in per_rank:
            setattr(cfg, name, max(1, getattr(cfg, name) // ctx.world_size))
    agent = ctx.model if make_agent is None else make_agent(ctx.model)
    with learner_autocast(ctx.device, precision):
        return _learn_batch(agent, ctx, batch, learn, cfg, stacked, out_of_time)


def _learn_batch(agent: Any, ctx: RankContext, batch: Any,
                 learn: Callable[..., Mapping[str, float]], cfg: Any, stacked: bool,
                 out_of_time: Callable[[], bool] | None) -> Mapping[str, float]:
    if not stacked:
        if out_of_time is not None:
            return learn(agent, ctx.optimizer, batch, cfg, ctx.step, out_of_time=out_of_time)
        return learn(agent, ctx.optimizer, batch, cfg, ctx.step)
    out: Mapping[str, float] = {}
    for j in range(next(iter(batch.values())).shape[1]):
        out = learn(agent, ctx.optimizer, batch.apply(lambda v: v[:, j]), cfg,  # noqa: B023
                    ctx.step)
    return out


def _loader(conn: Any, send: Callable[[tuple], None], stager: DeviceStager, rank: int,
            slots: list[dict[str, Tensor]], local: queue.Queue) -> None:
    """The loader thread: stages each announced shard onto the device, in order."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the driver is gone
            local.put(("stop",))
            return
        if msg[0] == "batch":
            _, index, slot, kind, kwargs, ring_slot = msg
            tensors, event = stager.stage(slot, slots[slot])
            send(("loaded", rank, index))
            local.put(("batch", index, kind, tensors, event, kwargs, ring_slot))
        else:
            local.put(msg)
            if msg[0] == "stop":
                return


def _start_rank(
    rank: int, spec: RankSpec, status: Tensor, published: list[dict[str, Tensor]]
) -> tuple[RankContext, Callable[..., Any]]:
    """Sets rank ``rank``'s process up: signals left to the driver, threads, device, the process
    group, then the model (with the driver's initial weights) and its optimizer; the rank's
    context and its learn function."""
    # The driver owns shutdown: a signal to the process group must not break the batch
    # the driver collects before its final checkpoint.
    ignore_ctrl_c()  # SIGINT was blocked from birth (rlstruct.parallel.startup)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch_driver()  # a SIGKILLed driver: the rank leaves, even in the middle of a learn phase
    torch.set_num_threads(spec.n_threads)
    device = torch.device(spec.devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    world = len(spec.devices)
    dist.init_process_group(
        spec.backend, init_method=spec.init_method, rank=rank, world_size=world,
        timeout=timedelta(seconds=spec.pg_timeout),
    )
    make_model, make_optimizer, learn = cloudpickle.loads(spec.factories)
    torch.manual_seed(spec.seed)
    model = make_model().to(device)
    model.load_state_dict(published[0])  # the initial weights, written by the driver
    optimizer = make_optimizer(model.parameters(), device=device)
    if spec.optimizer_state is not None:
        optimizer.load_state_dict(_load_bytes(spec.optimizer_state))
    return RankContext(rank, world, device, model, optimizer, status, spec.bucket_bytes), learn


def _answer_control(
    msg: tuple, rank: int, model: nn.Module, optimizer: Any,
    published: list[dict[str, Tensor]], send: Callable[[tuple], None],
) -> None:
    """Answers the driver's ``optimizer_state`` request (the rank's optimizer state, saved) or
    ``load`` (a resume: every rank loads the same weights and optimizer state)."""
    if msg[0] == "optimizer_state":
        buffer = io.BytesIO()
        torch.save(optimizer.state_dict(), buffer)
        send(("optimizer_state", rank, buffer.getvalue()))
        return
    if msg[1] is not None:
        model.load_state_dict(published[msg[1]])
    if msg[2] is not None:
        optimizer.load_state_dict(_load_bytes(msg[2]))
    send(("state_loaded", rank))


def rank_main(
    rank: int, spec: RankSpec, conn: Any, slots: list[dict[str, Tensor]], status: Tensor,
    published: list[dict[str, Tensor]],
) -> None:
    """The body of rank ``rank``'s process (see the module notes)."""
    lock = threading.Lock()
    index: int | None = None
    ring: Any = None
    ctx: RankContext | None = None
    exitcode = 0

    def send(msg: tuple) -> None:
        with lock:
            conn.send(msg)

    try:
        ctx, learn = _start_rank(rank, spec, status, published)
        device, model, optimizer = ctx.device, ctx.model, ctx.optimizer
        stager = DeviceStager(device)
        local: queue.Queue = queue.Queue(maxsize=1)  # one staged shard ahead of learn
        threading.Thread(target=_loader, args=(conn, send, stager, rank, slots, local),
                         name=f"rlstruct-rank{rank}-loader", daemon=True).start()
        send(("ready", rank, os.getpid()))
        while True:
            t0 = time.perf_counter()
            msg = local.get()
            wait_ms = (time.perf_counter() - t0) * 1e3
            if msg[0] == "stop":
                break
            if msg[0] in ("optimizer_state", "load"):
                _answer_control(msg, rank, model, optimizer, published, send)
                continue
            if msg[0] == "ring":  # the batcher's weights ring (LearnerGroup.publish_to)
                ring = msg[1]
                continue
            _, index, kind, tensors, event, kwargs, ring_slot = msg
            del msg
            stager.ready(tensors, event)
            ctx.allreduce_ms, ctx.n_allreduce = 0.0, 0
            ctx._set_status(_LEARN, index)
            start = time.perf_counter()
            out = learn(ctx, unpack(kind, tensors), **kwargs)
            del tensors
            metrics = _as_metrics(out)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            learn_ms = (time.perf_counter() - start) * 1e3
            if rank == 0:
                ctx._set_status(_PUBLISH)
                dst = (published[(index + 1) % len(published)] if ring_slot is None
                       else ring.slots[ring_slot])  # straight into the batcher's ring
                state = model.state_dict()
                torch._foreach_copy_([dst[k] for k in dst], [state[k] for k in dst])
            ctx._set_status(_IDLE)
            timings = {"load_wait_ms": wait_ms, "rank_learn_ms": learn_ms,
                       "allreduce_ms": ctx.allreduce_ms, "n_allreduce": float(ctx.n_allreduce)}
            send(("done", rank, index, metrics, timings))
            index = None
    except BaseException as exc:  # noqa: BLE001 - sent to the driver, which raises it
        exitcode = 1
        text = "".join(traceback.format_exception(exc))
        collective = ctx is not None and ctx.in_collective
        with contextlib.suppress(OSError):
            send(("error", rank, index, type(exc).__name__, str(exc), text, collective))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # Everything is sent and the group destroyed: skip the interpreter's teardown (seconds with
    # torch loaded), which would make close() slow.
    os._exit(exitcode)


def _load_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def _as_metrics(out: Any) -> dict[str, float]:
    if out is None:
        return {}
    if not isinstance(out, Mapping):
        raise TypeError(
            f"the learn function must return a Mapping[str, float] or None, got "
            f"{type(out).__name__}"
        )
    return {str(k): float(v) for k, v in out.items()}

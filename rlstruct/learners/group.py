"""A data-parallel learner group on ``torch.distributed``: N ranks, one model replica each.

The driver (the training script) keeps its loop: collect, learn, publish. ``group.learn(batch)``
splits the batch by rows into N equal shards; each rank computes the algorithm's own loss on its
shard, the gradients are averaged over the ranks (one flattened all-reduce per bucket) and every
rank takes the same optimizer step, so the replicas stay identical. Rank 0 then writes the new
weights into shared memory, where :meth:`LearnerGroup.state_dict` finds them for
``batcher.update`` without pickling: after :meth:`LearnerGroup.publish_to`, straight into the
process Batcher's own weights ring, which ``update`` then commits without a copy.

- Devices: ``cuda:k`` with NCCL where GPUs exist, the CPU with gloo elsewhere (how it is tested).
- Rendezvous: ``127.0.0.1`` on a free port on one node; across nodes the address is given
  (``master_addr`` / ``master_port``, like ``torchrun``'s ``MASTER_ADDR`` / ``MASTER_PORT``).
- Staging (:mod:`rlstruct.learners.staging`): :meth:`~LearnerGroup.submit` writes batch
  ``k + 1`` into shared memory and returns while the ranks still learn on batch ``k``; each
  rank's loader thread copies it onto the rank's device meanwhile.
  :meth:`~LearnerGroup.collect` returns batch ``k``'s metrics: the learn function's (averaged
  over the ranks) and ``load_wait_ms``, ``rank_learn_ms``, ``allreduce_ms`` (slowest rank),
  ``learner_queue`` (batches in flight at submit).
- Failures: a rank that raises or dies surfaces as :class:`~rlstruct.errors.LearnerError` naming
  the rank (the first culprit: a rank whose error came from a collective is a victim), with its
  traceback; a rank that hangs makes the driver's wait end at its deadline with
  :class:`~rlstruct.errors.LearnerTimeoutError` naming the ranks still busy outside a collective
  first. :meth:`~LearnerGroup.close` ends every rank (stop, then kill: ranks ignore SIGINT and
  SIGTERM, which reach the driver only), which
  destroys the process group and frees its port, in bounded time; a finalizer does it too.

The learn function runs on every rank as ``learn(ctx, shard, **kwargs)`` (``ctx``: a
:class:`~rlstruct.learners.rank.RankContext`) and takes each gradient step with ``ctx.step``,
which has :func:`~rlstruct.blocks.optim.gradient_step`'s signature. Every rank must take the same
number of steps per batch. The factories and the learn function are sent with cloudpickle.

One rank runs the same machinery and is bitwise equal to a single learner.
"""

from __future__ import annotations

import contextlib
import io
import math
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from multiprocessing.connection import wait as wait_ready
from typing import Any

import cloudpickle
import torch
from torch import Tensor

from rlstruct.batchers.process.processes import WORKER_PRELOAD
from rlstruct.dicttensor import DictTensor
from rlstruct.errors import BatcherStateError, ConfigError, LearnerError, LearnerTimeoutError
from rlstruct.learners.base import LearnerGroupBase, LearnFn, ModelFactory, OptimizerFactory
from rlstruct.learners.group_arguments import check_group_arguments, free_port
from rlstruct.learners.group_errors import Failure, culprit_error, hung_error
from rlstruct.learners.rank import RankSpec, rank_main
from rlstruct.learners.staging import StagingRing, pack, split_rows
from rlstruct.parallel.context import worker_context
from rlstruct.trajectories import Trajectories

__all__ = ["LearnerGroup", "free_port"]

_GRACE_S = 1.0  # after a failure, how long to listen for the others (to name the first culprit)
_TIMINGS = ("load_wait_ms", "rank_learn_ms", "allreduce_ms")


class LearnerGroup(LearnerGroupBase):
    """``n_learners`` learner processes ("ranks") that learn data-parallel on each batch.

    Ranks start at the first :meth:`submit` (the staging buffers are allocated from its shards).

    Args:
        make_model: builds the model (called once per rank, after ``torch.manual_seed(seed)``).
        make_optimizer: ``make_optimizer(model.parameters(), device=device)`` (e.g.
            ``functools.partial(rlstruct.blocks.optim.adam, lr=3e-4)``).
        learn: ``learn(ctx, shard, **kwargs) -> Mapping[str, float] | None`` on each rank.
        init_state: the initial weights (e.g. the driver's ``model.state_dict()``): every rank
            loads them, and they fix the keys of :meth:`state_dict`.
        n_learners: the number of ranks N (each batch's rows must be a multiple of it).
        devices: one device per rank; None: ``cuda:0..N-1`` if that many GPUs exist, else
            ``cpu`` for every rank.
        backend: ``"gloo"``, ``"nccl"``, or None: NCCL when every device is CUDA, else gloo.
        master_addr: rendezvous address (None: ``127.0.0.1``, one node).
        master_port: rendezvous port (None: a free port on ``127.0.0.1``).
        timeout: seconds :meth:`submit` and :meth:`collect` wait for the ranks.
        start_timeout: seconds the ranks may take to start and join the group.
        seed: the ranks' ``torch.manual_seed``.
        n_threads: torch threads per rank.
        n_slots: batches in flight per rank (shared-memory staging slots), >= 1.
        bucket_mb: megabytes of gradients per all-reduce bucket (> 0; like DDP's
            ``bucket_cap_mb``): buckets are reduced while backward still runs.

    Raises:
        ConfigError: every problem of the arguments, listed at once.

    Example (one rank, gloo on the CPU)::

        group = LearnerGroup(make_model, make_adam, ppo_learn, model.state_dict(), n_learners=2)
        with group:
            for traj in run.segments(batcher):
                metrics = group.learn(traj)                 # submit + collect
                run.publish(batcher, group.state_dict())    # rank 0's weights, shared memory
    """

    def __init__(self, make_model: ModelFactory, make_optimizer: OptimizerFactory,
                 learn: LearnFn, init_state: Mapping[str, Tensor], n_learners: int = 1,
                 devices: Sequence[str | torch.device] | None = None, *,
                 backend: str | None = None, master_addr: str | None = None,
                 master_port: int | None = None, timeout: float = 300.0,
                 start_timeout: float = 120.0, seed: int = 0, n_threads: int = 1,
                 n_slots: int = 2, bucket_mb: float = 25.0) -> None:
        problems, resolved, backend = check_group_arguments(
            n_learners, n_threads, n_slots, master_port, devices, backend)
        self._setup("LearnerGroup", problems, make_model, make_optimizer, learn, init_state,
                    timeout, start_timeout, bucket_mb)
        addr = master_addr or "127.0.0.1"
        port = master_port or free_port(addr)
        self.n_learners, self.devices, self.backend = n_learners, resolved, backend
        self.n_slots = n_slots
        self._make_model, self._make_optimizer = make_model, make_optimizer
        self._spec = RankSpec(
            factories=cloudpickle.dumps((make_model, make_optimizer, learn)),
            devices=[str(d) for d in resolved], backend=backend,
            init_method=f"tcp://{addr}:{port}", seed=seed, n_threads=n_threads,
            pg_timeout=max(self.timeout, 30.0), bucket_bytes=self.bucket_bytes,
        )
        self.address = (addr, port)
        # Rank 0 writes the weights after batch k into slot k % 3 (the driver reads a slot while
        # at most two more batches are in flight). Slot 0 first holds the initial weights.
        self._published = [
            {k: torch.empty(v.shape, dtype=v.dtype).share_memory_() for k, v in init_state.items()}
            for _ in range(n_slots + 1)
        ]
        torch._foreach_copy_(list(self._published[0].values()),
                             [init_state[k].detach().cpu() for k in self._published[0]])
        self._latest = 0  # index of the slot that holds the weights of the last collected batch
        self._status = torch.zeros(n_learners, 4, dtype=torch.float64).share_memory_()
        self._rings: list[StagingRing] = []
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._loaded = [-1] * n_learners
        self._results: dict[int, dict[int, tuple[dict, dict]]] = {}
        self._queue_sizes: dict[int, int] = {}
        self._submitted = self._collected = 0
        self._kind = ""
        self._failures: list[Failure] = []
        self._error: LearnerError | None = None
        self._optimizer_state: bytes | None = None
        self._to_load: bytes | None = None  # an optimizer state for the ranks to start from
        self._loaded_state: set[int] = set()
        self._latest_weights: dict[str, Tensor] = self._published[0]
        self._target: Any = None  # publish_to: (weakref to the batcher, the driver's thread)
        self._ring: Any = None  # the batcher's SharedWeights, once sent to rank 0
        self._direct: dict[int, tuple[Any, int]] = {}  # batch -> (ring, version) reserved
        self._ready: set[int] = set()
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns, 5.0)

    # ------------------------------------------------------------------ the driver's calls
    @property
    def pending(self) -> int:
        """Batches submitted but not collected yet."""
        return self._submitted - self._collected

    def submit(self, batch: DictTensor | Trajectories, **kwargs: Any) -> None:
        """Splits ``batch`` into one shard per rank and stages the shards; returns while the
        ranks may still learn on earlier batches. ``kwargs`` (small, picklable: a learning
        rate, a flag) go to every rank's learn function.

        Raises:
            ShapeError: the rows are not a multiple of ``n_learners``, or a shard's shapes differ
                from the first batch's; KeyMismatchError: other keys than the first batch's.
            BatcherStateError: ``n_slots`` batches are already in flight (collect first), or the
                group is closed.
            LearnerError, LearnerTimeoutError: a rank failed, or did not free a slot in time.
        """
        self._check_usable()
        if self.pending >= self.n_slots:
            raise BatcherStateError(
                f"submit: {self.pending} batches are already in flight (n_slots={self.n_slots}); "
                "collect() one first"
            )
        kind, tensors = pack(batch)
        shards = split_rows({k: v.detach() for k, v in tensors.items()}, self.n_learners)
        if not self._procs:
            self._kind = kind
            self._start(shards)
        elif kind != self._kind:
            raise ConfigError(f"submit: this batch is a {kind}, the first was a {self._kind}")
        for ring, shard in zip(self._rings, shards):
            ring.check(shard)
        index, slot = self._submitted, self._submitted % self.n_slots
        self._wait(lambda: min(self._loaded) >= index - self.n_slots, self.timeout,
                   f"loading batch {index - self.n_slots}", index - self.n_slots)
        self._queue_sizes[index] = self.pending
        ring_slot = self._reserve(index)
        for rank, (ring, shard) in enumerate(zip(self._rings, shards)):
            ring.write(slot, shard)
            try:
                self._conns[rank].send(("batch", index, slot, kind, kwargs, ring_slot))
            except OSError:  # the rank is gone: _wait names it
                self._wait(lambda: False, _GRACE_S, f"staging batch {index}", index)
        self._results[index] = {}
        self._submitted += 1

    def collect(self, timeout: float | None = None) -> dict[str, float]:
        """Waits until every rank has learned the oldest submitted batch; returns its metrics:
        the learn function's, averaged over the ranks, and the slowest rank's ``load_wait_ms``,
        ``rank_learn_ms``, ``allreduce_ms``, with ``n_allreduce`` and ``learner_queue``.

        Raises:
            BatcherStateError: nothing was submitted.
            LearnerError: a rank raised or died (named, with its traceback).
            LearnerTimeoutError: a rank did not finish within ``timeout`` (default: the
                group's), named.
        """
        self._check_usable()
        if self.pending == 0:
            raise BatcherStateError("collect: no batch submitted (submit(batch) first)")
        index = self._collected
        wait_s = self.timeout if timeout is None else float(timeout)
        self._wait(lambda: len(self._results[index]) == self.n_learners, wait_s,
                   f"learning batch {index}", index)
        answers = self._results.pop(index)
        self._collected += 1
        self._latest = index + 1
        ring, version = self._direct.pop(index, (None, 0))
        self._latest_weights = (self._published[self._latest % len(self._published)]
                                if ring is None else ring.slots[version % ring.n_slots])
        metrics: dict[str, float] = {}
        for key in answers[0][0]:
            metrics[key] = sum(a[0].get(key, math.nan) for a in answers.values()) / len(answers)
        for key in _TIMINGS:
            metrics[key] = max(a[1][key] for a in answers.values())
        metrics["n_allreduce"] = answers[0][1]["n_allreduce"]
        metrics["learner_queue"] = float(self._queue_sizes.pop(index))
        return metrics

    def _weights(self) -> dict[str, Tensor]:
        """CPU tensors in shared memory written by rank 0 (after :meth:`publish_to`, the
        batcher's own ring slot that rank 0 filled). Read-only."""
        return self._latest_weights

    def publish_to(self, batcher: Any) -> bool:
        """Direct publication: from now on rank 0 writes the weights of each batch submitted
        from this thread with nothing in flight straight into ``batcher``'s shared ring, in
        the slot of the batcher's next version (``batcher.reserve_weights``), and
        :meth:`state_dict` returns that slot: ``batcher.update(group.state_dict())`` checks it
        (keys, shapes, finite values, as ever) and commits it without a copy. The loop must be
        ``learn`` then that ``update``, nothing else updating the batcher in between (a learner
        thread, as IMPALA's, submits from another thread: it keeps the shared copy).

        Returns:
            True for a process Batcher of this node (with ``reserve_weights``); False for the
            others (Serial, Ray...), which keep rank 0's shared copy and the batcher's.
        """
        if not callable(getattr(batcher, "reserve_weights", None)):
            return False
        self._target = (weakref.ref(batcher), threading.get_ident())
        return True

    def _reserve(self, index: int) -> int | None:
        """The ring slot rank 0 writes batch ``index``'s weights into (publish_to), or None."""
        if self._target is None or self.pending or threading.get_ident() != self._target[1]:
            return None
        batcher = self._target[0]()
        reserved = batcher.reserve_weights() if batcher is not None else None
        if reserved is None or reserved[0].specs != self._weight_specs.specs:
            return None  # before the batcher's first update, or other weights (a submodule)
        ring, version = reserved
        if ring is not self._ring:
            self._conns[0].send(("ring", ring))
            self._ring = ring
        self._direct[index] = reserved
        return version % ring.n_slots

    def _load(self, state: Mapping[str, Tensor] | None, optimizer_state: dict | None) -> None:
        """Every rank loads ``state`` and/or ``optimizer_state`` (before the first batch: the
        ranks start from them)."""
        self._check_idle("load_state_dict")
        if state is not None:
            slot = self._latest % len(self._published)
            dst = self._latest_weights = self._published[slot]
            torch._foreach_copy_([dst[k] for k in dst], [state[k].detach() for k in dst])
            if self._procs:
                self._load_on_ranks(slot, None)
            else:
                torch._foreach_copy_(list(self._published[0].values()), list(dst.values()))
        if optimizer_state is not None:
            buffer = io.BytesIO()
            torch.save(optimizer_state, buffer)
            if self._procs:
                self._load_on_ranks(None, buffer.getvalue())
            else:
                self._to_load = buffer.getvalue()

    def optimizer_state_dict(self) -> dict[str, Any]:
        """Rank 0's optimizer state (identical on every rank), for checkpoints; before the
        first batch, a fresh optimizer's. Call it with nothing in flight.

        Raises:
            BatcherStateError: batches are in flight.
        """
        self._check_idle("optimizer_state_dict")
        if not self._procs:
            model = self._make_model()
            model.load_state_dict(self._published[0])
            optimizer = self._make_optimizer(model.parameters(), device=torch.device("cpu"))
            if self._to_load is not None:
                optimizer.load_state_dict(torch.load(io.BytesIO(self._to_load),
                                                     weights_only=False))
            return optimizer.state_dict()
        self._optimizer_state = None
        self._conns[0].send(("optimizer_state",))
        self._wait(lambda: self._optimizer_state is not None, self.timeout,
                   "sending its optimizer state", None)
        return torch.load(io.BytesIO(self._optimizer_state or b""), weights_only=False)

    # ------------------------------------------------------------------ shutdown
    def close(self, timeout: float = 10.0) -> None:
        """Ends every rank (stop; then kill what is left) in about ``timeout``
        seconds at most. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        _shutdown(self._procs, self._conns, timeout)

    # ------------------------------------------------------------------ internals
    def _start(self, shards: list[dict[str, Tensor]]) -> None:
        # the batchers' forkserver: torch is imported already
        ctx = worker_context(start=True, preload=WORKER_PRELOAD)
        spec = replace(self._spec, optimizer_state=self._to_load)
        self._rings = [StagingRing(shard, self.n_slots) for shard in shards]
        for rank in range(self.n_learners):
            mine, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=rank_main, name=f"rlstruct-learner-rank{rank}", daemon=True,
                args=(rank, spec, theirs, self._rings[rank].slots, self._status,
                      self._published),
            )
            proc.start()
            theirs.close()
            self._procs.append(proc)
            self._conns.append(mine)
        self._wait(lambda: len(self._ready) == self.n_learners, self.start_timeout,
                   "starting and joining the process group", None)

    def _check_idle(self, call: str) -> None:
        self._check_usable()
        if self.pending:
            raise BatcherStateError(
                f"{call}: {self.pending} batches in flight (collect them first)")

    def _load_on_ranks(self, slot: int | None, optimizer_state: bytes | None) -> None:
        """Every rank loads the weights of publication slot ``slot`` and/or the optimizer
        state; returns once all have."""
        self._loaded_state = set()
        for conn in self._conns:
            conn.send(("load", slot, optimizer_state))
        self._wait(lambda: len(self._loaded_state) == self.n_learners, self.timeout,
                   "loading a state", None)

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise BatcherStateError("the learner group is closed; create a new LearnerGroup")

    def _receive(self, rank: int, msg: tuple) -> None:
        tag = msg[0]
        if tag == "ready":
            self._ready.add(rank)
        elif tag == "loaded":
            self._loaded[rank] = max(self._loaded[rank], msg[2])
        elif tag == "done":
            self._results[msg[2]][rank] = (msg[3], msg[4])
        elif tag == "optimizer_state":
            self._optimizer_state = msg[2]
        elif tag == "state_loaded":
            self._loaded_state.add(rank)
        elif tag == "error":
            _, _, batch, exc_type, text, tb, collective = msg
            self._failures.append((rank, batch, exc_type, text, tb, collective, None))

    def _poll(self, seconds: float) -> None:
        """Reads what the ranks sent within ``seconds``; records deaths as failures."""
        conns = [c for c in self._conns if not c.closed]
        ready = wait_ready(conns + [p.sentinel for p in self._procs], timeout=max(0.0, seconds))
        for rank, conn in enumerate(self._conns):
            if conn in ready:
                try:
                    while conn.poll():
                        self._receive(rank, conn.recv())
                except (EOFError, OSError):
                    conn.close()
        known = {f[0] for f in self._failures}
        for rank, proc in enumerate(self._procs):
            if proc.exitcode is not None and rank not in known:
                self._failures.append((rank, None, "", "", "", False, proc.exitcode))

    def _wait(self, done: Callable[[], bool], seconds: float, what: str,
              batch: int | None) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout(what, seconds, batch)
            self._poll(min(remaining, 0.5))
            if self._failures:
                end = time.monotonic() + _GRACE_S  # let the other ranks' reports arrive
                while time.monotonic() < end:
                    self._poll(end - time.monotonic())
                self._error = culprit_error(self._failures, what)
                raise self._error

    def _timeout(self, what: str, seconds: float, batch: int | None) -> LearnerTimeoutError:
        waiting = [r for r in range(self.n_learners)
                   if batch is None or r not in self._results.get(batch, {})]
        return hung_error(what, seconds, waiting, self._status.tolist())


def _shutdown(procs: list[Any], conns: list[Any], timeout: float) -> None:
    """Stops the ranks in bounded time: ask, wait, kill (they ignore SIGTERM); closes the
    pipes."""
    for conn in conns:
        with contextlib.suppress(OSError, ValueError):
            conn.send(("stop",))
    deadline = time.monotonic() + max(0.0, timeout - 2.0)
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
    for conn in conns:
        conn.close()
    for proc in procs:
        if proc.exitcode is not None:
            proc.close()

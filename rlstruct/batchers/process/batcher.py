"""``Batcher``: CPU worker processes, each with a copy of the agent and many envs.

The slot buffer is allocated once in shared memory before the workers start; worker ``p`` owns
rows ``[p * n, (p + 1) * n)`` (``n`` envs each) and writes its segments there by index. Commands
and tiny replies travel over one pipe per worker. Every wait has a deadline: sends and receives
go through :mod:`rlstruct.parallel.transport`, and waits watch pipes and process sentinels, so a
dead, hung or frozen worker becomes a typed error, never a hang.

What every multi-worker backend decides alike (checks, seeds, restarts, errors, weights) is the
:class:`~rlstruct.batchers.pool.WorkerPool`'s; each worker serves a
:class:`~rlstruct.batchers.core.WorkerCore` (:mod:`rlstruct.batchers.process.worker`); workers start
from a forkserver with torch and rlstruct preloaded (:mod:`rlstruct.batchers.process.processes`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.multiprocessing as tmp

from rlstruct.batchers.base import Phase, serialized
from rlstruct.batchers.buffer import SlotBuffer, Specs
from rlstruct.batchers.pool import WorkerPool, worker_error
from rlstruct.batchers.process.processes import (
    WORKER_PRELOAD,
    await_ready,
    death_error,
    send_close,
    shutdown,
    start_worker,
)
from rlstruct.batchers.process.worker import Command, Reply, WorkerSpec
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.parallel import transport
from rlstruct.parallel.context import FORKSERVER_MAX_FDS, worker_context
from rlstruct.parallel.weights import SharedWeights
from rlstruct.trajectories import Trajectories

__all__ = ["Batcher"]


class Batcher(WorkerPool):
    """Collects trajectories with ``n_processes`` CPU worker processes.

    Args:
        n_timesteps: ``T``, the maximum number of steps of a segment.
        create_agent: ``create_agent(**agent_args) -> Agent`` (lambdas and closures are fine).
        agent_args: keyword arguments of ``create_agent``; CPU tensors and modules only.
        create_env: ``create_env(**env_args, seed=s) -> VecEnv`` whose env ``k`` uses ``s + k``.
        env_args: keyword arguments of ``create_env`` (no ``seed``).
        n_processes: ``P``, the number of workers; each owns ``n`` envs, so ``B = P * n``.
        seeds: the run seed: env of global index ``g`` gets ``seeds * 2**20 + g`` (the same data
            for any ``P`` with the same total number of envs); or one int per process
            (rlstructures-style: env ``k`` of process ``p`` gets ``seeds[p] + k``).
        agent_info: example DictTensor (1 or B rows) fixing keys, shapes and dtypes of
            agent_info; the default at ``reset``.
        env_info: same for env_info (passed to the envs at reset).
        agent_seeds: one agent seed per process; derived from ``seeds`` when None.
        device: must be the CPU (workers are CPU-only; use SerialBatcher for a GPU).
        n_threads: torch threads per worker (1: one core per worker).
        timeout: seconds a segment (or a reset/update) may take before the silent workers are
            reported as hung (with ``adaptive_timeout``: the most it may).
        start_timeout: seconds the workers may take to start.
        pipeline: segment slots per worker. 1 (default): synchronous, ``execute`` collects
            one segment and ``get`` returns it. ``K >= 2``: pipelined, see below.
        restart: ``None`` (default): fail fast, the first worker fault raises. A
            :class:`~rlstruct.batchers.restart.RestartPolicy`: a worker whose process dies or
            whose env/agent raises is replaced (same index, fresh env seeds derived from the
            run seed and its restart count, current weights, envs reset); the segments it owed
            are not retried, their rows of that worker are left out of those batches, and
            each fault is appended to ``batcher.faults``. Hung workers (timeouts) still raise.
        adaptive_timeout: the silence limit follows the measured segments: 10 x the slowest
            one so far, at least 60 s, at most ``timeout``
            (:class:`~rlstruct.batchers.deadlines.Deadlines`).
        deadline: a ``time.monotonic()`` value past which no reset or segment waits (a wait
            that starts after it still gets a few seconds), e.g. the end of a run's time
            budget; None: none.

    Pipelined collection (``pipeline=K >= 2``): ``execute()`` starts a stream; each worker
    collects segments back to back into K slots of shared memory, and ``get()`` returns the
    oldest finished one (a copy: its slot is free again at once). After ``get()`` returns
    segment ``j``, segment ``j + K`` starts at the next ``update()`` (with those weights) or
    at the next ``get()``, whichever comes first: workers never run more than K segments
    ahead of the learner (bounded memory, back-pressure), never overwrite unread data, and
    for a learner that updates once per batch, segment ``j + K`` is collected with the
    weights learnt from segments ``0..j`` (a lag of ``K - 1`` updates, visible in
    ``info['policy_version']``). The data depend only on the seeds and on the sequence of
    calls, not on timing: same seeds, same learner, same data. ``reset()`` stops the stream
    (it waits for the segments in flight and drops them); a worker error surfaces at the next
    ``get()`` or ``update()``, with worker, env and step.

    Random numbers: each worker seeds its process's global generators (torch, numpy, ``random``)
    with ``agent_seeds[0]`` before it builds its env and agent (so a model initialised in
    ``create_agent`` has the same weights in every worker), then with its own ``agent_seeds[p]``
    (the stream the agent samples from). The same configuration gives bitwise-equal batches;
    with one process they equal a ``SerialBatcher``'s with the same seeds. Env seeds depend on
    the global env index only, but each process has its own sampling stream, so an agent that
    samples from the global generators collects other actions with P=2 than with P=1 (a
    deterministic agent, or one seeding per row, collects the same data for any P).

    Raises:
        ConfigError: a bad argument (every bad field listed), before any process starts.
        TypeError: a factory or argument that cannot be pickled, before any process starts.
        WorkerError: a worker failed while starting (env or agent factory raised).
    """

    #: What a tensor or module not on the CPU in the arguments is told.
    _NON_CPU = (
        "Batcher workers are CPU-only; pass CPU tensors/models (the batcher copies them) or use "
        "SerialBatcher(device=...) for a GPU"
    )

    # The constructor is the WorkerPool's (the arguments above); these are the transport's parts.
    def _prepare(self, device: DeviceLike) -> list[str]:
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._contexts: list[multiprocessing.context.BaseContext] = []
        if torch.device(device).type != "cpu":
            return [
                f"device={device!r}: Batcher workers are CPU-only; use SerialBatcher(device=...) "
                "to collect on a GPU (one process, DeviceEnv)"
            ]
        return []

    def _before_probe(self) -> None:
        # The forkserver imports torch and rlstruct while the probe runs.
        self._contexts.append(worker_context(start=True, preload=WORKER_PRELOAD))

    def _start(self, device: DeviceLike, step_specs: Specs, info_specs: Specs) -> None:
        ctx = self._contexts.pop()
        self.buffers = [
            SlotBuffer(self._n_rows, self.n_timesteps, step_specs, info_specs, shared=True)
            for _ in range(self.pipeline)
        ]
        self.buffer = self.buffers[0]
        self._agent_info_in = {k: v.clone().share_memory_() for k, v in self._agent_info.items()}
        self._env_info_in = {k: v.clone().share_memory_() for k, v in self._env_info.items()}

        n_shared = sum(len(b.steps) + len(b.info) + 1 for b in self.buffers)
        n_shared += len(self._agent_info_in) + len(self._env_info_in)
        if n_shared > FORKSERVER_MAX_FDS:  # one descriptor per shared tensor travels at start
            ctx = tmp.get_context("spawn")
        self._finalizer = weakref.finalize(self, shutdown, self._procs, self._conns)
        self._ctx = ctx
        started = time.monotonic()
        for p in range(self.n_processes):
            proc, conn = self._start_worker(p, self._env_bases[p])
            self._procs.append(proc)
            self._conns.append(conn)
        self._weights: SharedWeights | None = None
        self._shared_version: int | None = None
        self._requested: list[int | None] = [None] * self.n_processes  # last load asked of each
        self._inflight: list[deque[tuple[int, int | None]]] = [deque() for _ in self._procs]
        self._waiting: set[int] = set(range(self.n_processes))  # READY / RESET_DONE expected
        self._reset_results: dict[int, int] = {}
        self._last_progress = started
        self._last_blob: tuple[int, bytes] | None = None
        try:
            self._pump(lambda: not self._waiting, lambda: started + self._start_timeout, "start")
        except BaseException:
            self.close()  # nobody gets this object to close it: stop the workers now
            raise
        self.startup_seconds = time.monotonic() - started

    def _start_worker(self, p: int, env_seed: int) -> tuple[Any, Connection]:
        spec = WorkerSpec(
            **self._core_fields(p, env_seed, "cpu"),
            buffers=self.buffers,
            agent_info_in=self._agent_info_in,
            env_info_in=self._env_info_in,
        )
        return start_worker(self._ctx, spec, p)

    # ------------------------------------------------------------------ waiting
    def _stop_hung(self, hung: Sequence[int]) -> None:
        """CLOSE to the healthy workers (they close their envs), SIGTERM to the ``hung`` ones."""
        send_close(self._conns, skip=hung)
        for w in hung:
            with contextlib.suppress(Exception):  # gone already: shutdown escalates anyway
                self._procs[w].terminate()

    def _busy(self) -> list[int]:
        """Workers the batcher expects an answer from."""
        return sorted(w for w in range(len(self._procs)) if self._inflight[w] or w in self._waiting)

    def _handle(self, w: int, message: tuple[Reply, Any]) -> None:
        kind, payload = message
        if kind is Reply.ERROR:
            final = self._absorb(w, worker_error(payload, w), self._owed(w))
            if final is not None:
                raise self._fail(final)
            return
        if kind is Reply.DONE:
            slot, n_running, cpu_s = payload
            self._worker_cpu[w] = cpu_s
            segment, _load = self._inflight[w].popleft()
            assert segment % self.pipeline == slot, (segment, slot)
            self._delivered(segment, w, n_running)
            self._last_progress = time.monotonic()
        elif kind in (Reply.READY, Reply.RESET_DONE):
            self._waiting.discard(w)
            if kind is Reply.RESET_DONE:
                self._reset_results[w] = payload

    def _owed(self, w: int) -> list[int]:
        """The segments worker ``w`` was asked for and has not delivered."""
        return [segment for segment, _load in self._inflight[w]]

    def _stop_worker(self, w: int) -> None:
        shutdown([self._procs[w]], [self._conns[w]], grace=0.5)

    def _slot_buffer(self, segment: int) -> SlotBuffer:
        return self.buffers[segment % self.pipeline]

    def _buffers(self) -> list[SlotBuffer]:
        return self.buffers

    def _start_replacement(self, w: int, env_seed: int, segments: list[int]) -> None:
        self._procs[w], self._conns[w] = self._start_worker(w, env_seed)
        self._inflight[w], self._requested[w] = deque(), None
        self._await_ready(w)
        if self._weights is not None:
            self._send(w, (Command.WEIGHTS, (self._weights, self._shared_version)), "restart")
            self._requested[w] = self._shared_version
        blob = self._last_blob
        if blob is not None and (self._shared_version is None or blob[0] > self._shared_version):
            self._send(w, (Command.UPDATE, blob), "restart")
        n_running = 0
        if self._phase is not Phase.NEW or w in self._waiting:
            self._send(w, (Command.RESET, None), "restart")
            self._waiting.add(w)
            n_running = self._n_envs
        for segment in segments:
            self._done.setdefault(segment, {})[w] = n_running

    def _await_ready(self, w: int) -> None:
        """Waits for a replacement worker's READY (bounded by ``start_timeout``)."""
        deadline = time.monotonic() + self._start_timeout
        try:
            error = await_ready(w, self._conns[w], self._procs[w], deadline)
        except TimeoutError:
            raise self._timeout([w], "restart") from None
        if error is not None:
            raise self._fail(error)

    def _drain(self, w: int, deadline: float, what: str) -> None:
        """Handles every message worker ``w`` has sent so far."""
        conn = self._conns[w]
        while conn.poll():
            try:
                message = transport.recv(conn, deadline)
            except (EOFError, OSError):
                break
            except TimeoutError:
                raise self._timeout([w], what) from None
            self._handle(w, message)
            if self._conns[w] is not conn:
                break  # the worker was replaced

    def _pump(
        self,
        done: Callable[[], bool],
        deadline: Callable[[], float],
        what: str,
        blocking: bool = True,
    ) -> bool:
        """Handles the workers' messages until ``done()``; False if not ``blocking`` and not
        done yet. A worker that died or stayed silent past ``deadline()`` raises at once,
        without waiting for the other workers to stop (``close`` does that). It looks at the
        workers at least once a second."""
        while True:
            limit = deadline()
            for w in range(len(self._procs)):
                self._drain(w, limit, what)
            for w, proc in enumerate(self._procs):
                if not proc.is_alive():
                    self._drain(w, limit, what)  # a last message before death
                    if self._procs[w] is not proc:
                        continue  # that message was an error, and the worker was replaced
                    final = self._absorb(w, death_error(w, proc, what), self._owed(w))
                    if final is not None:
                        raise self._fail(final)
            if done():
                return True
            remaining = limit - time.monotonic()
            if remaining <= 0:
                raise self._timeout(self._busy() or list(range(len(self._procs))), what)
            if not blocking:
                return False
            wait(self._conns + [p.sentinel for p in self._procs], timeout=min(remaining, 1.0))

    def _send(self, w: int, message: Any, what: str) -> None:
        try:
            transport.send(self._conns[w], message, time.monotonic() + self.timeout)
        except TimeoutError:
            raise self._timeout([w], what) from None
        except OSError:
            pass  # a dead worker's pipe is broken: _pump reports it with its exit code

    def _release(self, new_info: bool = False) -> None:
        """Queues the next segment in every worker, with the newest weights."""
        segment = self._released
        slot = segment % self.pipeline
        for w in range(len(self._procs)):
            load = self._shared_version
            if load is not None and self._requested[w] == load:
                load = None  # already loaded (or queued) there
            self._send(w, (Command.EXECUTE, (slot, self._version, load, new_info)), "execute")
            self._inflight[w].append((segment, load))
            if load is not None:
                self._requested[w] = load
        self._release_times[segment] = time.monotonic()
        self._released += 1

    # ------------------------------------------------------------------ API
    @serialized
    def reset(
        self, agent_info: DictTensor | None = None, env_info: DictTensor | None = None
    ) -> None:
        """Resets every env (with ``env_info``) and every row's agent state and agent_info.

        While pipelined collection is streaming, it first waits for the segments already
        started and drops them, then resets (``execute`` starts streaming again).

        Args:
            agent_info: DictTensor with 1 or B rows; default: the constructor's example.
            env_info: DictTensor with 1 or B rows; default: the constructor's example.
        """
        self._require("reset", Phase.NEW, Phase.READY, Phase.STREAMING)
        ai = self._rows_info(agent_info, self._agent_info, self._agent_info_specs, "agent_info")
        ei = self._rows_info(env_info, self._env_info, self._env_info_specs, "env_info")
        if self._phase is Phase.STREAMING:
            self._pump(
                lambda: not any(self._inflight), self._segment_deadline, "execute (reset drain)"
            )
            self._end_stream()
        for k, v in ai.items():
            self._agent_info_in[k].copy_(v)
        for k, v in ei.items():
            self._env_info_in[k].copy_(v)
        self._waiting, self._reset_results = set(range(len(self._procs))), {}
        for w in range(len(self._procs)):
            self._send(w, (Command.RESET, None), "reset")
        started = time.monotonic()
        self._pump(lambda: not self._waiting, lambda: self.deadlines.at(started), "reset")
        self._n_running = sum(self._reset_results.values())
        self._phase = Phase.READY

    @serialized
    def execute(self, agent_info: DictTensor | None = None) -> None:
        """Starts collecting: one segment (synchronous), or the stream (``pipeline >= 2``).

        Returns at once. With ``pipeline=K >= 2``, the workers start K segments and keep
        going: see the class docstring for when each later segment starts.

        Args:
            agent_info: new per-row agent_info (1 or B rows) used from now on by running rows.

        Raises:
            BatcherStateError: not after ``reset``/``get`` (e.g. a second ``execute``).
        """
        ai = self._begin_execute(agent_info)
        if ai is not None:
            for k, v in ai.items():
                self._agent_info_in[k].copy_(v)
        self._start_stream(new_info=ai is not None)

    @serialized
    def get(
        self, blocking: bool = True, device: DeviceLike | None = None
    ) -> tuple[Trajectories | None, int | None]:
        """The oldest segment not returned yet: ``(Trajectories, n_still_running)``.

        Args:
            blocking: wait for the segment; when False, return ``(None, None)`` while it is
                still being collected.
            device: where the batch should live (default: the CPU). For a GPU learner, pass
                its device: the shared buffer is page-locked once and full segments are copied
                straight to the GPU (one copy, by DMA); otherwise the batch goes through one
                CPU copy, then ``to(device)``.

        Raises:
            WorkerError: a worker raised (with worker, env, step and remote traceback) or died.
            WorkerTimeoutError: a worker stayed silent longer than ``timeout``.
        """
        self._require("get", Phase.RUNNING, Phase.STREAMING)
        self._after_update()  # pipelined: the segment K ahead, if no update released it
        segment, n_workers = self._next_get, len(self._procs)
        if not self._pump(
            lambda: len(self._done.get(segment, ())) == n_workers,
            self._segment_deadline,
            "execute",
            blocking,
        ):
            return None, None
        return self._hand_over(device)

    def _publish_weights(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copies ``state_dict`` once into the shared ring of versioned copies (allocated at the
        first call and sent to every worker); each worker loads the newest version at the start
        of its next segment."""
        if self._weights is None:
            self._weights = SharedWeights(state_dict, max(2, self.pipeline + 1))
            for w in range(len(self._procs)):
                self._send(w, (Command.WEIGHTS, (self._weights, None)), "update")
        self._wait_for_slot(version)
        if self._weights.is_slot(version, state_dict):  # filled in place (reserve_weights)
            self._weights.commit(version)
        else:
            self._weights.write(version, state_dict)
        self._shared_version = version

    def _wait_for_slot(self, version: int) -> None:
        """Never overwrite a version that a queued segment has yet to load."""
        assert self._weights is not None
        ring = self._weights.n_slots
        self._pump(
            lambda: not any(
                load is not None and load % ring == version % ring
                for q in self._inflight
                for _seg, load in q
            ),
            lambda: self._last_progress + self.timeout,
            "execute (update)",
        )

    @serialized
    def reserve_weights(self) -> tuple[SharedWeights, int] | None:
        """``(ring, version)``: the shared ring and the version the next ``update`` makes, its
        slot reserved (tagged as being written) for a writer in any process of this node to fill
        in place; ``update(ring.slots[version % ring.n_slots])`` then checks it (keys, shapes,
        finite values) and commits it without a copy. None before the first state_dict update
        (which allocates the ring). Nothing else may update the batcher in between."""
        self._require("reserve_weights", Phase.NEW, Phase.READY, Phase.RUNNING, Phase.STREAMING)
        if self._weights is None:
            return None
        version = self._version + 1
        self._wait_for_slot(version)
        self._weights.reserve(version)
        return self._weights, version

    def _publish_info(self, version: int, info: Any) -> None:
        """Pickles ``info`` once and sends it to every worker, applied between segments."""
        blob = transport.to_cpu_bytes(info)
        self._last_blob = (version, blob)
        for w in range(len(self._procs)):
            self._send(w, (Command.UPDATE, (version, blob)), "update")

    def close(self) -> None:
        """Stops every worker and frees the shared memory: idempotent, bounded (about 3 s).

        Workers are asked to leave first (they close their envs and agent), then sent SIGTERM
        (an orderly exit too, for a worker busy in a segment), then SIGKILL. The shared-memory
        buffers and weights are released here, not when the Batcher object is garbage
        collected; batches already returned by ``get`` are copies and stay valid.
        """
        if self._phase is not Phase.FAILED:
            self._phase = Phase.CLOSED
        if hasattr(self, "_finalizer"):
            self._finalizer()
        if hasattr(self, "deadlines"):
            self.deadlines.close()  # the pause watch
        for buffer in getattr(self, "buffers", []):
            buffer.unpin()
        self.buffer = None  # type: ignore[assignment]
        self.buffers, self._weights = [], None
        self._agent_info_in, self._env_info_in = {}, {}

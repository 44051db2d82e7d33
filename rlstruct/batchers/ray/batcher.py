"""``RayBatcher``: the ``Batcher`` API on Ray actors, from one machine to a cluster.

One Ray actor per worker index owns its VecEnv, its copy of the agent and a local (non-shared)
:class:`~rlstruct.batchers.buffer.SlotBuffer` of its ``n`` rows, and wraps the same
:class:`~rlstruct.batchers.core.WorkerCore` as a ``Batcher`` worker
(:mod:`rlstruct.batchers.ray.actor`). A segment's rows come back as numpy arrays; the driver
copies them into its own buffer of all ``B`` rows (one per segment slot) and reads the batch
from there exactly as ``Batcher`` reads its shared buffer, so both return the same Trajectories.
Weights travel once per ``update`` through Ray's object store
(:mod:`~rlstruct.batchers.ray.updates`); every wait has a deadline (``ray.wait`` with timeouts).

This module holds the driver, the transport of a :class:`~rlstruct.batchers.pool.WorkerPool`
(start, call, wait, restart). What it asks Ray about one actor (the remote class, spawn, kill, an
answer read as a value or a typed error) is :mod:`~rlstruct.batchers.ray.remote`'s; the
connection is :mod:`~rlstruct.parallel.ray_cluster`'s; the wire format
(:mod:`~rlstruct.batchers.ray.wire`) and option checks (:mod:`~rlstruct.batchers.ray.options`)
need no Ray. Nothing else in rlstruct imports Ray (``from rlstruct.batchers import RayBatcher``
imports it on demand). Without Ray installed the module still imports, and ``RayBatcher(...)``
raises an ImportError that says how to install the ``ray`` extra.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rlstruct.batchers.base import Phase, serialized
from rlstruct.batchers.buffer import SlotBuffer, Specs
from rlstruct.batchers.pool import CLOSE_GRACE_S, WorkerPool, pool_arguments
from rlstruct.batchers.ray.actor import ActorSpec
from rlstruct.batchers.ray.options import check_ray_options
from rlstruct.batchers.ray.remote import RayBatcherWorker as RayBatcherWorker
from rlstruct.batchers.ray.remote import free_resources, kill_actor, read_answer, spawn_actor
from rlstruct.batchers.ray.updates import UpdateLog
from rlstruct.batchers.ray.wire import to_wire, write_rows
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.errors import WorkerError, install_hint
from rlstruct.parallel.ray_cluster import SESSION as _SESSION
from rlstruct.parallel.ray_cluster import ray, require_ray
from rlstruct.parallel.transport import to_cpu_bytes
from rlstruct.trajectories import Trajectories

__all__ = ["RayBatcher", "INSTALL_HINT"]

#: What the ImportError says when Ray is missing.
INSTALL_HINT = f"RayBatcher needs Ray, an optional extra: {install_hint('ray')}"


def _require_ray() -> None:
    require_ray("RayBatcher")


class RayBatcher(WorkerPool):
    """Collects trajectories with ``n_processes`` Ray actors: the ``Batcher`` API on a cluster.

    Same arguments, methods, call order and Trajectories as :class:`~rlstruct.Batcher`
    (``reset() -> execute() -> get() ... -> close()``, ``update`` at any time): with the same
    seeds, ``n_processes`` and envs per worker, the batches are bitwise equal to a ``Batcher``'s,
    for any agent (actor ``p`` seeds its process's global generators with ``agent_seeds[0]``
    before it builds env and agent, then with ``agent_seeds[p]``, like worker ``p``).

    Args:
        n_timesteps: ``T``, the maximum number of steps of a segment.
        create_agent: as for ``Batcher``; so are ``agent_args``, ``create_env``, ``env_args``,
            ``seeds``, ``agent_info``, ``env_info`` and ``agent_seeds`` (one per actor).
        n_processes: ``P``, the number of actors; each owns ``n`` envs, so ``B = P * n``.
        device: where each actor runs its agent and buffer: ``"cpu"``, or ``"cuda"`` with
            ``num_gpus_per_actor > 0`` (the GPU Ray assigned to the actor; its envs run on the
            CPU behind a DeviceEnv). Batches always come back on the CPU.
        n_threads: torch threads per actor.
        timeout: seconds a segment (or a reset) may take before the silent actors are reported
            as hung (:class:`WorkerTimeoutError`).
        start_timeout: seconds the actors may take to start (scheduling included: an actor
            that the cluster has no room for times out with the cluster's free resources).
        pipeline: segment slots, as for ``Batcher``: ``K >= 2`` queues K segments on every
            actor and starts segment ``j + K`` at the ``update`` or ``get`` after segment ``j``
            was returned, with the newest weights (the same data as ``Batcher(pipeline=K)``).
        restart: ``None`` (default): fail fast. A :class:`RestartPolicy`: an actor that dies
            (process killed, node lost) or whose env/agent raises is replaced by a fresh actor
            with the same index, env seeds ``restart_env_seed(base, restart_count)``, the current
            weights and reset envs; the failed segment is not retried: its rows are left out of
            that batch, and the fault is appended to ``batcher.faults``. Hung actors still raise.
        adaptive_timeout: the silence limit follows the measured segments, as for ``Batcher``.
        deadline: a ``time.monotonic()`` value past which no reset or segment waits, as for
            ``Batcher``.
        address: the Ray cluster: ``None`` connects to the one this process is already connected
            to (``ray.init`` called before), else to ``RAY_ADDRESS`` when set, else starts a
            local cluster (see below); ``"auto"``, ``"host:port"`` or ``"ray://..."`` connect to
            a running cluster; ``"local"`` starts a local one. A process already connected to
            Ray (``ray.init`` called before) uses that connection, whatever ``address`` says.
        num_cpus_per_actor: CPUs Ray reserves for each actor (fractions allowed).
        num_gpus_per_actor: GPUs Ray reserves for each actor (fractions allowed, e.g. 0.25: four
            actors share one GPU; more than 1 must be a whole number).
        actor_options: more ``ray.remote`` options of the actors, e.g.
            ``{"scheduling_strategy": "SPREAD"}``, ``{"resources": {...}}`` or a
            ``runtime_env``.

    The cluster: without ``address``, ``RAY_ADDRESS`` or a connection, the batcher starts a
    local, loopback-only cluster of ``max(cpu_count, P * num_cpus_per_actor)`` CPUs and shuts it
    down at ``close()`` (the last RayBatcher sharing it does); a running cluster is never shut
    down, only this batcher's actors are killed (:mod:`~rlstruct.parallel.ray_cluster`).

    Attributes:
        faults: every actor fault a restart absorbed, oldest first
            (:class:`~rlstruct.batchers.restart.Fault`).
        nodes: the Ray node id of each actor (updated by restarts).
        startup_seconds: how long the constructor took, cluster start included.

    Raises:
        ImportError: Ray is not installed (``pip install -e '.[ray]'``).
        ConfigError: a bad argument (every bad field listed), before any actor starts; or
            actors that a local cluster it started could never place (a GPU it lacks).
        TypeError: a factory or argument that cannot be pickled, before any actor starts.
        WorkerError: an actor failed while starting (env or agent factory raised).
        WorkerTimeoutError: the actors did not start within ``start_timeout``.
    """

    #: What a tensor or module not on the CPU in the arguments is told.
    _NON_CPU = (
        "pass CPU tensors/models (each actor builds its own copy, and moves it to its device)"
    )

    @pool_arguments
    def __init__(
        self,
        *args: Any,
        address: str | None = None,
        num_cpus_per_actor: float = 1,
        num_gpus_per_actor: float = 0,
        actor_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # The arguments every worker pool takes (``args``, ``kwargs``: ``n_timesteps`` to
        # ``restart``, see the class docstring) go to WorkerPool.__init__, which checks them
        # with these, the options of Ray, and calls _prepare and _start.
        _require_ray()
        self._begun = time.monotonic()
        self._address, self._actor_options_given = address, actor_options
        self._num_cpus, self._num_gpus = num_cpus_per_actor, num_gpus_per_actor
        super().__init__(*args, **kwargs)

    def _prepare(self, device: DeviceLike) -> list[str]:
        self._actors: list[Any] = []
        return check_ray_options(
            device, self._address, self._num_cpus, self._num_gpus, self._actor_options_given
        )

    def _start(self, device: DeviceLike, step_specs: Specs, info_specs: Specs) -> None:
        n_processes = self.n_processes
        self._device = torch.device(device)
        self._actor_options = dict(self._actor_options_given or {})
        self._step_specs, self._info_specs = step_specs, info_specs
        #: The driver's copy of every actor's rows, one per segment slot, read like a
        #: Batcher's shared buffers.
        self.buffers = [
            SlotBuffer(self._n_rows, self.n_timesteps, step_specs, info_specs)
            for _ in range(self.pipeline)
        ]
        self.buffer = self.buffers[0]
        self._agent_info_rows, self._env_info_rows = self._agent_info, self._env_info
        self._updates = UpdateLog(n_processes)
        self._outstanding: dict[int, Any] = {}  # worker -> ObjectRef of its start or reset
        self._running: dict[int, int] = {}  # worker -> n_running after its last reset
        # Per worker, the segments released to it and not answered yet, oldest first (an
        # actor answers its calls in order).
        self._queued: list[deque[tuple[int, Any]]] = [deque() for _ in range(n_processes)]
        self._last_progress = time.monotonic()
        self.nodes: list[str | None] = [None] * n_processes

        session = _SESSION
        assert session is not None  # _require_ray() passed
        owns = session.acquire(
            self._address, max(os.cpu_count() or 1, math.ceil(n_processes * self._num_cpus))
        )
        self._owns_ray = owns
        self._finalizer = weakref.finalize(self, session.finalize, self._actors, owns)
        try:
            if owns:
                session.check_room(n_processes, self._num_cpus, self._num_gpus)
            started = time.monotonic()
            for p in range(n_processes):
                actor, ref = self._spawn(p, self._env_bases[p])
                self._actors.append(actor)
                self._outstanding[p] = ref
            self._last_progress = started
            self._pump("start", lambda: started + self._start_timeout)
        except BaseException:
            self.close()  # nobody gets this object to close it: stop the actors now
            raise
        self.startup_seconds = time.monotonic() - self._begun

    # ------------------------------------------------------------------ actors
    def _spawn(self, p: int, env_seed: int) -> tuple[Any, Any]:
        """Creates actor ``p`` and asks it to start; returns the actor and the start's ref."""
        spec = ActorSpec(
            **self._core_fields(p, env_seed, str(self._device)),
            step_specs=self._step_specs,
            info_specs=self._info_specs,
            timeout=self.timeout,
        )
        return spawn_actor(spec, self._num_cpus, self._num_gpus, self._actor_options)

    # ------------------------------------------------------------------ waiting
    def _stop_hung(self, hung: Sequence[int]) -> None:
        """Kills the ``hung`` actors now (``close`` does the rest)."""
        for w in hung:
            kill_actor(self._actors[w])

    def _timeout_hint(self, what: str) -> str:
        if what not in ("start", "restart"):
            return super()._timeout_hint(what)
        free = free_resources()
        return (
            f"an actor Ray cannot place? each asks {self._num_cpus} CPU and {self._num_gpus} "
            f"GPU (plus actor_options {self._actor_options}); free now: {free}"
        )

    def _result(self, w: int, ref: Any, what: str, owed: Sequence[int] = ()) -> Any:
        """The value of worker ``w``'s finished call, or None when its fault was absorbed by a
        restart; raises the typed error otherwise (``owed``: the segments a failed ``execute``
        leaves worker ``w`` owing)."""
        try:
            outcome, value = read_answer(w, ref, what, self.timeout)
        except TimeoutError:
            raise self._timeout([w], what) from None
        if outcome == "ok":
            return value
        # A replacement whose factories raise is not replaced again; a lost one (e.g. placed
        # on a node that was lost, not yet declared dead) is.
        if what == "restart" and outcome == "failed":
            raise self._fail(value)
        return self._absorb_or_fail(w, value, list(owed))

    def _absorb_or_fail(self, w: int, error: WorkerError, segments: list[int]) -> None:
        """None once a restart absorbed ``error``; raises it when the policy does not allow one.
        A lost actor costs one restart whenever it is lost, a replacement's start included."""
        final = self._absorb(w, error, segments)
        if final is not None:
            raise self._fail(final)

    def _accept(self, w: int, value: Any, what: str) -> None:
        """Stores a successful answer of worker ``w``."""
        if what == "start":
            self.nodes[w] = value["node"]
            self._locate(w, value["host"], value["pid"])
        else:
            self._running[w] = value

    def _accept_segment(self, w: int, segment: int, value: Any) -> None:
        """Copies worker ``w``'s rows of ``segment`` into that segment's slot buffer."""
        self._delivered(segment, w, value["n_running"])
        self._worker_cpu[w] = value["cpu_s"]
        write_rows(self._slot_buffer(segment), self._rows(w), value)

    def _pump(self, what: str, deadline: Callable[[], float], blocking: bool = True) -> bool:
        """Handles the answers of the outstanding calls until none is left (True), or until
        nothing is ready when not ``blocking`` (False). An error raises at once, without waiting
        for the other actors; a silent actor past ``deadline()`` raises a timeout."""
        while self._outstanding:
            by_ref = {ref: w for w, ref in self._outstanding.items()}
            refs = list(by_ref)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            if not ready:
                remaining = deadline() - time.monotonic()
                if remaining <= 0:
                    raise self._timeout(list(self._outstanding), what)
                if not blocking:
                    return False
                ready, _ = ray.wait(refs, num_returns=1, timeout=min(remaining, 1.0))
            for ref in ready:
                w = by_ref[ref]
                if self._outstanding.get(w) is not ref:
                    continue  # replaced while handling an earlier answer
                del self._outstanding[w]
                value = self._result(w, ref, what)
                if value is not None:
                    self._accept(w, value, what)
                self._last_progress = time.monotonic()
        return True

    def _pump_segment(self, segment: int, blocking: bool = True) -> bool:
        """Handles the actors' answers until every worker delivered ``segment`` (True), or until
        nothing is ready when not ``blocking`` (False); an error raises at once, a silence past
        the segment's deadline is a timeout."""
        n_workers = len(self._actors)
        while len(self._done.get(segment, ())) < n_workers:
            heads = {q[0][1]: w for w, q in enumerate(self._queued) if q}
            assert heads, (segment, self._done)  # a segment that nobody owes is done
            refs = list(heads)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            if not ready:
                remaining = self._segment_deadline() - time.monotonic()
                if remaining <= 0:
                    raise self._timeout(sorted(heads.values()), "execute")
                if not blocking:
                    return False
                ready, _ = ray.wait(refs, num_returns=1, timeout=min(remaining, 1.0))
            for ref in ready:
                w, queue = heads[ref], self._queued[heads[ref]]
                if not queue or queue[0][1] is not ref:
                    continue  # replaced while handling an earlier answer
                done, _ref = queue.popleft()
                owed = [done, *(s for s, _r in queue)]
                value = self._result(w, ref, "execute", owed)
                if value is not None:
                    self._accept_segment(w, done, value)
                self._last_progress = time.monotonic()
        return True

    def _release(self, new_info: bool = False) -> None:
        """Starts the next segment in every actor, with the updates it has not loaded yet."""
        segment = self._released
        for w, actor in enumerate(self._actors):
            rows = self._rows(w)
            info = None
            if new_info:
                info = self._agent_info_rows.slice(rows.start, rows.stop).clone()
            ref = actor.execute.remote(self._updates.take(w), self._version, info)
            self._queued[w].append((segment, ref))
        self._release_times[segment] = time.monotonic()
        self._released += 1

    def _wait_one(self, w: int, ref: Any, what: str, limit: float) -> Any:
        """Waits for one call of worker ``w`` (a replacement's start or reset)."""
        while True:
            ready, _ = ray.wait(
                [ref], num_returns=1, timeout=max(0.0, min(1.0, limit - time.monotonic()))
            )
            if ready:
                return self._result(w, ref, what)
            if time.monotonic() >= limit:
                raise self._timeout([w], what)

    # ------------------------------------------------------------------ restarts
    def _stop_worker(self, w: int) -> None:
        kill_actor(self._actors[w])  # a dead actor is what a restart replaces
        self._outstanding.pop(w, None)
        self._queued[w].clear()

    def _slot_buffer(self, segment: int) -> SlotBuffer:
        return self.buffers[segment % self.pipeline]

    def _buffers(self) -> list[SlotBuffer]:
        return self.buffers

    def _start_replacement(self, w: int, env_seed: int, segments: list[int]) -> None:
        self._actors[w], ref = self._spawn(w, env_seed)
        value = self._wait_one(w, ref, "restart", time.monotonic() + self._start_timeout)
        if value is None:  # lost while starting: a further restart replaced it
            for segment in segments:
                self._done.setdefault(segment, {})[w] = self._running.get(w, 0)
            return
        self.nodes[w] = value["node"]
        self._locate(w, value["host"], value["pid"])
        rows = self._rows(w)
        ref = self._actors[w].reset.remote(
            self._updates.catch_up(w),
            self._agent_info_rows.slice(rows.start, rows.stop).clone(),
            self._env_info_rows.slice(rows.start, rows.stop).clone(),
        )
        n_running = self._wait_one(w, ref, "reset", time.monotonic() + self.timeout)
        if n_running is not None:  # else: the reset failed and a further restart did it
            self._running[w] = n_running
        for segment in segments:  # owed, spoiled: delivered with no rows
            self._done.setdefault(segment, {})[w] = self._running.get(w, 0)

    # ------------------------------------------------------------------ API
    @serialized
    def reset(
        self, agent_info: DictTensor | None = None, env_info: DictTensor | None = None
    ) -> None:
        """Resets every env (with ``env_info``) and every row's agent state and agent_info.

        Args:
            agent_info: DictTensor with 1 or B rows; default: the constructor's example.
            env_info: DictTensor with 1 or B rows; default: the constructor's example.

        Raises:
            WorkerError: an actor failed (and no restart absorbed it).
            WorkerTimeoutError: an actor stayed silent longer than ``timeout``.
        """
        self._require("reset", Phase.NEW, Phase.READY, Phase.STREAMING)
        ai = self._rows_info(agent_info, self._agent_info, self._agent_info_specs, "agent_info")
        ei = self._rows_info(env_info, self._env_info, self._env_info_specs, "env_info")
        if self._phase is Phase.STREAMING:  # wait for the segments in flight, drop them
            for segment in range(self._next_get, self._released):
                self._pump_segment(segment)
            self._end_stream()
        self._agent_info_rows, self._env_info_rows = ai, ei
        for w, actor in enumerate(self._actors):
            rows = self._rows(w)
            self._outstanding[w] = actor.reset.remote(
                self._updates.take(w),
                ai.slice(rows.start, rows.stop).clone(),
                ei.slice(rows.start, rows.stop).clone(),
            )
        started = time.monotonic()
        self._pump("reset", lambda: self.deadlines.at(started))
        self._n_running = sum(self._running.values())
        self._phase = Phase.READY

    @serialized
    def execute(self, agent_info: DictTensor | None = None) -> None:
        """Starts collecting one segment in every actor; returns at once (``agent_info``: new
        per-row agent_info, 1 or B rows, used from now on by running rows).

        Raises:
            BatcherStateError: not after ``reset``/``get`` (e.g. a second ``execute``).
        """
        ai = self._begin_execute(agent_info)
        if ai is not None:
            self._agent_info_rows = ai
        self._start_stream(new_info=ai is not None)

    @serialized
    def get(
        self, blocking: bool = True, device: DeviceLike | None = None
    ) -> tuple[Trajectories | None, int | None]:
        """The segment started by ``execute``: ``(Trajectories, n_still_running)``.

        Rows with no valid step are left out (rows whose env ended earlier, and the rows of an
        actor whose segment failed and was restarted); ``T`` is the longest row's length.

        Args:
            blocking: wait for the segment; when False, return ``(None, None)`` while it is
                still being collected.
            device: where the batch should live (default: the CPU), as for ``Batcher.get``.

        Raises:
            WorkerError: an actor raised (with worker, env, step and remote traceback) or died,
                and no restart absorbed it.
            WorkerTimeoutError: an actor stayed silent longer than ``timeout``.
        """
        self._require("get", Phase.RUNNING, Phase.STREAMING)
        self._after_update()  # pipelined: the segment K ahead, if no update released it
        if not self._pump_segment(self._next_get, blocking):
            return None, None
        return self._hand_over(device)

    def _publish_weights(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copies the state_dict to the CPU and puts it ONCE in Ray's object store; every actor
        reads that one object (zero-copy on its node) at the start of its next call."""
        # Let go of the versions this one supersedes before putting it: the object store
        # then reuses their memory (several times faster than fresh pages for 200 MB).
        updates = self._updates
        updates.drop_superseded_weights()
        previous, updates.last_weights = updates.last_weights, None
        try:
            ref = ray.put({k: to_wire(v.detach().contiguous()) for k, v in state_dict.items()})
        except BaseException:
            updates.last_weights = previous
            raise
        del previous
        updates.add(("weights", version, ref))

    def _publish_info(self, version: int, info: Any) -> None:
        """Serialises ``info`` once into Ray's object store; applied in order."""
        self._updates.add(("info", version, ray.put(to_cpu_bytes(info))))

    def actors(self) -> list[Any]:
        """The Ray actor handles, by worker index (replacements included)."""
        return list(self._actors)

    def close(self) -> None:
        """Closes every actor's envs and agent (up to about 1 s), then kills every actor; shuts
        Ray down only if this batcher started it (or opened the connection). Idempotent."""
        if self._phase is not Phase.FAILED:
            self._phase = Phase.CLOSED
        if hasattr(self, "deadlines"):
            self.deadlines.close()  # the pause watch
        if not hasattr(self, "_finalizer"):
            return
        if self._finalizer.alive and _SESSION is not None:
            _SESSION.kill(self._actors, grace=CLOSE_GRACE_S)
        self._finalizer()
        self._outstanding.clear()

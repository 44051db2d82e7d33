"""``RayBatcher``: the ``Batcher`` API on Ray actors, from one machine to a cluster.

One Ray actor per worker index owns its VecEnv, its copy of the agent and a local (non-shared)
:class:`~rlstruct.batchers.buffer.SlotBuffer` of its ``n`` rows, and wraps the same
:class:`~rlstruct.batchers.core.WorkerCore` as a ``Batcher`` worker
(:mod:`rlstruct.batchers.ray_actor`). At the end of a segment it
returns its rows as numpy arrays (its rows' info, lengths, and the steps up to its longest row);
the driver copies them into its own buffer of all ``B`` rows, in worker order, and reads the batch
from there exactly as ``Batcher`` reads its shared buffer, so both return the same Trajectories.

Weights travel once per ``update`` through Ray's object store (one ``ray.put`` of CPU arrays that
every actor reads); each actor loads the newest one at the start of its next call. Every wait has
a deadline (``ray.wait`` with timeouts), an actor's exception comes back as a payload with worker,
env, step and traceback (never a bare ``RayTaskError``), a dead actor is a :class:`WorkerError`
naming its worker, and ``close`` kills every actor.

This module holds what needs Ray: the connection (a local cluster or a running one), the actor
class, and the driver, the transport of a :class:`~rlstruct.batchers.pool.WorkerPool` (start,
call, wait, kill). The wire format (:mod:`~rlstruct.batchers.ray_wire`), the actor's body
(:mod:`~rlstruct.batchers.ray_actor`) and the option checks (:mod:`~rlstruct.batchers.ray_options`)
live in modules of their own. This module imports Ray; nothing else in rlstruct does
(``from rlstruct.batchers import RayBatcher`` imports it on demand). Without Ray installed the
module still imports, and ``RayBatcher(...)`` raises an ImportError that says
``pip install rlstruct[ray]``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rlstruct.agent import Agent
from rlstruct.batchers.base import Phase, serialized
from rlstruct.batchers.buffer import SlotBuffer
from rlstruct.batchers.pool import CLOSE_GRACE_S, WorkerPool, worker_error
from rlstruct.batchers.ray_actor import ActorBody, ActorSpec, Op
from rlstruct.batchers.ray_options import check_ray_options
from rlstruct.batchers.ray_session import RaySession
from rlstruct.batchers.ray_wire import from_wire, readonly_ok, to_wire
from rlstruct.batchers.restart import RestartPolicy
from rlstruct.batchers.transport import to_cpu_bytes
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.errors import WorkerError
from rlstruct.trajectories import Trajectories

try:
    import ray
    import ray.exceptions
except ImportError as _import_error:  # the extra is not installed: RayBatcher() says so
    ray = None
    RAY_IMPORT_ERROR: ImportError | None = _import_error
else:
    RAY_IMPORT_ERROR = None

__all__ = ["RayBatcher", "INSTALL_HINT"]

#: What a tensor or module not on the CPU in the arguments is told.
_NON_CPU = "pass CPU tensors/models (each actor builds its own copy, and moves it to its device)"

#: What the ImportError says when Ray is missing.
INSTALL_HINT = "RayBatcher needs Ray, an optional extra: pip install rlstruct[ray]"


def _require_ray() -> None:
    if ray is None:
        raise ImportError(f"{INSTALL_HINT} ({RAY_IMPORT_ERROR})") from RAY_IMPORT_ERROR


def _ray_constants() -> Any:
    """``ray._private.ray_constants``, where this Ray version has it."""
    with contextlib.suppress(ImportError):
        from ray._private import ray_constants

        return ray_constants
    return None


#: The Ray connection RayBatchers opened themselves (None without Ray).
_SESSION = RaySession(ray, _ray_constants) if ray is not None else None


# ------------------------------------------------------------------------------ the actor
class RayBatcherWorker(ActorBody):
    """A RayBatcher actor (wrapped with ``ray.remote`` by the batcher): the Ray-free
    :class:`~rlstruct.batchers.ray_actor.ActorBody`, plus the two calls that need Ray."""

    def _fetch(self, refs: list[Any]) -> list[Any]:
        return ray.get(refs, timeout=self.spec.timeout)

    def _where(self) -> dict[str, Any]:
        return {"node": ray.get_runtime_context().get_node_id(), **self.core.where()}


_ACTOR_CLASS: list[Any] = []


def _actor_class() -> Any:
    if not _ACTOR_CLASS:
        _ACTOR_CLASS.append(ray.remote(RayBatcherWorker))
    return _ACTOR_CLASS[0]


# ------------------------------------------------------------------------------ the driver
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
        agent_args: keyword arguments of ``create_agent``; CPU tensors and modules only.
        create_env: ``create_env(**env_args, seed=s) -> VecEnv``.
        env_args: keyword arguments of ``create_env`` (no ``seed``).
        n_processes: ``P``, the number of actors; each owns ``n`` envs, so ``B = P * n``.
        seeds: the run seed, or one int per actor.
        agent_info: example DictTensor of agent_info; the default at ``reset``.
        env_info: example DictTensor of env_info.
        agent_seeds: one agent seed per actor; derived from ``seeds`` when None.
        device: where each actor runs its agent and buffer: ``"cpu"``, or ``"cuda"`` with
            ``num_gpus_per_actor > 0`` (the GPU Ray assigned to the actor; its envs run on the
            CPU behind a DeviceEnv). Batches always come back on the CPU.
        n_threads: torch threads per actor.
        timeout: seconds a segment (or a reset) may take before the silent actors are reported
            as hung (:class:`WorkerTimeoutError`).
        start_timeout: seconds the actors may take to start (scheduling included: an actor
            that the cluster has no room for times out with the cluster's free resources).
        pipeline: must be 1: pipelined collection is not supported by RayBatcher yet (the
            attribute is 1).
        restart: ``None`` (default): fail fast. A :class:`RestartPolicy`: an actor that dies
            (process killed, node lost) or whose env/agent raises is replaced by a fresh actor
            with the same index, env seeds ``restart_env_seed(base, restart_count)``, the current
            weights and reset envs; the failed segment is not retried: its rows are left out of
            that batch, and the fault is appended to ``batcher.faults``. Hung actors still raise.
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

    The cluster. When this process is not connected to Ray and neither ``address`` nor
    ``RAY_ADDRESS`` name a cluster, the batcher starts a local one for itself: bound to the
    loopback address only, no dashboard, usage statistics off, ``max(cpu_count, P *
    num_cpus_per_actor)`` CPUs; ``close()`` shuts it down (when several RayBatchers share it,
    the last one to close does). On a running cluster (the caller's ``ray.init``, ``address``
    or ``RAY_ADDRESS``) it only creates its actors and ``close()`` kills those actors, nothing
    else: the cluster is never shut down, and a connection the caller opened stays open (a
    connection the batcher opened itself is closed, the cluster runs on).

    Attributes:
        faults: every actor fault a restart absorbed, oldest first
            (:class:`~rlstruct.batchers.restart.Fault`).
        nodes: the Ray node id of each actor (updated by restarts).
        startup_seconds: how long the constructor took, cluster start included.

    Raises:
        ImportError: Ray is not installed (``pip install rlstruct[ray]``).
        ConfigError: a bad argument (every bad field listed), before any actor starts; or
            actors that a local cluster it started could never place (a GPU it lacks).
        TypeError: a factory or argument that cannot be pickled, before any actor starts.
        WorkerError: an actor failed while starting (env or agent factory raised).
        WorkerTimeoutError: the actors did not start within ``start_timeout``.
    """

    _PIPELINED = False

    def __init__(
        self,
        n_timesteps: int,
        create_agent: Callable[..., Agent],
        agent_args: Mapping[str, Any] | None,
        create_env: Callable[..., VecEnv],
        env_args: Mapping[str, Any] | None,
        n_processes: int = 1,
        seeds: int | Sequence[int] = 0,
        agent_info: DictTensor | None = None,
        env_info: DictTensor | None = None,
        agent_seeds: Sequence[int] | None = None,
        device: DeviceLike = "cpu",
        *,
        n_threads: int = 1,
        timeout: float = 300.0,
        start_timeout: float = 120.0,
        pipeline: int = 1,
        restart: RestartPolicy | None = None,
        address: str | None = None,
        num_cpus_per_actor: float = 1,
        num_gpus_per_actor: float = 0,
        actor_options: Mapping[str, Any] | None = None,
    ) -> None:
        _require_ray()
        begun = time.monotonic()
        self._actors: list[Any] = []
        problems = check_ray_options(
            device, address, num_cpus_per_actor, num_gpus_per_actor, actor_options
        )
        step_specs, info_specs = self._setup(
            n_timesteps, (create_agent, agent_args), (create_env, env_args), (agent_info, env_info),
            n_processes, seeds, agent_seeds, (n_threads, timeout, start_timeout, pipeline, restart),
            problems, _NON_CPU,
        )  # fmt: skip
        self._device = torch.device(device)
        self._num_cpus, self._num_gpus = num_cpus_per_actor, num_gpus_per_actor
        self._actor_options = dict(actor_options or {})
        self._step_specs, self._info_specs = step_specs, info_specs
        #: The driver's copy of every actor's rows, read like a Batcher's shared buffer.
        self.buffer = SlotBuffer(self._n_rows, n_timesteps, step_specs, info_specs)
        self._agent_info_rows, self._env_info_rows = self._agent_info, self._env_info
        self._last_weights: Op | None = None
        self._last_info: Op | None = None
        self._pending: list[list[Op]] = [[] for _ in range(n_processes)]
        self._outstanding: dict[int, Any] = {}  # worker -> ObjectRef of its current call
        self._running: dict[int, int] = {}  # worker -> n_running after its last call
        self._segment = -1
        self._started_at = self._last_progress = time.monotonic()
        self.nodes: list[str | None] = [None] * n_processes

        session = _SESSION
        assert session is not None  # _require_ray() passed
        owns = session.acquire(
            address, max(os.cpu_count() or 1, math.ceil(n_processes * num_cpus_per_actor))
        )
        self._owns_ray = owns
        self._finalizer = weakref.finalize(self, session.finalize, self._actors, owns)
        try:
            if owns:
                session.check_room(n_processes, num_cpus_per_actor, num_gpus_per_actor)
            started = time.monotonic()
            for p in range(n_processes):
                actor, ref = self._spawn(p, self._env_bases[p])
                self._actors.append(actor)
                self._outstanding[p] = ref
            self._started_at = self._last_progress = started
            self._pump("start", lambda: started + start_timeout)
        except BaseException:
            self.close()  # nobody gets this object to close it: stop the actors now
            raise
        self._started = True
        self._n_running: int | None = None
        self._phase = Phase.NEW
        self.startup_seconds = time.monotonic() - begun

    # ------------------------------------------------------------------ actors
    def _spawn(self, p: int, env_seed: int) -> tuple[Any, Any]:
        """Creates actor ``p`` and asks it to start; returns the actor and the start's ref."""
        spec = ActorSpec(
            **self._core_fields(p, env_seed, str(self._device)),
            step_specs=self._step_specs,
            info_specs=self._info_specs,
            timeout=self.timeout,
        )
        actor = (
            _actor_class()
            .options(
                num_cpus=self._num_cpus,
                num_gpus=self._num_gpus,
                max_restarts=0,
                max_task_retries=0,
                **self._actor_options,
            )
            .remote(spec)
        )
        return actor, actor.start.remote()

    def _take_ops(self, w: int) -> list[Op]:
        """The updates worker ``w`` has not received yet; a state_dict followed by a newer one
        (with nothing in between) is skipped, as the ``Batcher``'s ring skips it."""
        ops, self._pending[w] = self._pending[w], []
        return [
            op
            for i, op in enumerate(ops)
            if not (op[0] == "weights" and i + 1 < len(ops) and ops[i + 1][0] == "weights")
        ]

    def _catch_up(self) -> list[Op]:
        """What a replacement actor loads before it collects: the newest weights, and the newest
        non-tensor update when it came after them."""
        ops = [op for op in (self._last_weights, self._last_info) if op is not None]
        ops.sort(key=lambda op: op[1])
        if len(ops) == 2 and ops[0][0] == "info":
            ops = ops[1:]  # the weights came later: the info update is older than them
        return ops

    # ------------------------------------------------------------------ waiting
    def _stop_hung(self, hung: Sequence[int]) -> None:
        """Kills the ``hung`` actors now (``close`` does the rest)."""
        for w in hung:
            with contextlib.suppress(Exception):
                ray.kill(self._actors[w], no_restart=True)

    def _timeout_hint(self, what: str) -> str:
        if what not in ("start", "restart"):
            return super()._timeout_hint(what)
        free: Any = "unknown"
        with contextlib.suppress(Exception):
            free = {k: v for k, v in ray.available_resources().items() if "memory" not in k}
        return (
            f"an actor Ray cannot place? each asks {self._num_cpus} CPU and {self._num_gpus} "
            f"GPU (plus actor_options {self._actor_options}); free now: {free}"
        )

    def _result(self, w: int, ref: Any, what: str) -> Any:
        """The value of worker ``w``'s finished call, or None when its fault was absorbed by a
        restart; raises the typed error otherwise."""
        try:
            status, payload = ray.get(ref, timeout=self.timeout)
        except ray.exceptions.GetTimeoutError:
            raise self._timeout([w], what) from None
        except ray.exceptions.RayActorError as e:
            error = WorkerError(
                f"worker {w} died during {what}: its Ray actor is gone ({type(e).__name__}; "
                "Ray's account below)",
                worker=w,
                remote_traceback=str(e),
            )
            if what == "restart":  # e.g. placed on a node that was lost, not yet declared dead
                return self._absorb_or_fail(w, error, [])
        except ray.exceptions.RayError as e:
            error = WorkerError(
                f"worker {w} failed during {what}: {type(e).__name__}",
                worker=w,
                exc_type=type(e).__name__,
                remote_traceback=str(e),
            )
        else:
            if status == "ok":
                return payload
            prefix = "the replacement of " if what == "restart" else ""
            error = worker_error(payload, w, prefix)
        if what == "restart":  # a replacement whose factories raise is not replaced again
            raise self._fail(error)
        return self._absorb_or_fail(w, error, [self._segment] if what == "execute" else [])

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
        elif what == "reset":
            self._running[w] = value
        else:
            self._running[w] = value["n_running"]
            self._worker_cpu[w] = value["cpu_s"]
            rows, t = self._rows(w), value["t"]
            buffer = self.buffer
            with readonly_ok():
                for k, v in value["steps"].items():
                    buffer.steps[k][:t, rows].copy_(from_wire(v))
                for k, v in value["info"].items():
                    buffer.info[k][rows].copy_(from_wire(v))
                buffer.lengths[rows].copy_(from_wire(value["lengths"]))

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
        with contextlib.suppress(Exception):
            ray.kill(self._actors[w], no_restart=True)
        self._outstanding.pop(w, None)

    def _slot_buffer(self, segment: int) -> SlotBuffer:
        return self.buffer

    def _buffers(self) -> list[SlotBuffer]:
        return [self.buffer]

    def _start_replacement(self, w: int, env_seed: int, segments: list[int]) -> None:
        self._actors[w], ref = self._spawn(w, env_seed)
        self._pending[w] = []
        value = self._wait_one(w, ref, "restart", time.monotonic() + self._start_timeout)
        if value is None:
            return  # lost while starting: a further restart replaced it
        self.nodes[w] = value["node"]
        self._locate(w, value["host"], value["pid"])
        rows = self._rows(w)
        ref = self._actors[w].reset.remote(
            self._catch_up(),
            self._agent_info_rows.slice(rows.start, rows.stop).clone(),
            self._env_info_rows.slice(rows.start, rows.stop).clone(),
        )
        n_running = self._wait_one(w, ref, "reset", time.monotonic() + self.timeout)
        if n_running is not None:  # else: the reset failed and a further restart did it
            self._running[w] = n_running

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
        self._require("reset", Phase.NEW, Phase.READY)
        ai = self._rows_info(agent_info, self._agent_info, self._agent_info_specs, "agent_info")
        ei = self._rows_info(env_info, self._env_info, self._env_info_specs, "env_info")
        self._agent_info_rows, self._env_info_rows = ai, ei
        for w, actor in enumerate(self._actors):
            rows = self._rows(w)
            self._outstanding[w] = actor.reset.remote(
                self._take_ops(w),
                ai.slice(rows.start, rows.stop).clone(),
                ei.slice(rows.start, rows.stop).clone(),
            )
        started = time.monotonic()
        self._pump("reset", lambda: started + self.timeout)
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
        self._segment += 1
        for w, actor in enumerate(self._actors):
            rows = self._rows(w)
            info = None
            if agent_info is not None:
                info = self._agent_info_rows.slice(rows.start, rows.stop).clone()
            self._outstanding[w] = actor.execute.remote(self._take_ops(w), self._version, info)
        self._started_at = self._last_progress = time.monotonic()
        self._phase = Phase.RUNNING

    def _segment_deadline(self) -> float:
        """A segment is overdue once its actors were silent for ``timeout`` seconds."""
        return max(self._started_at, self._last_progress) + self.timeout

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
            device: where the batch should live (default: the CPU). For a GPU learner, pass its
                device: the driver's buffer is page-locked once and full segments are copied
                straight to the GPU (one copy); otherwise through one CPU copy, then
                ``to(device)``, as ``Batcher.get`` does.

        Raises:
            WorkerError: an actor raised (with worker, env, step and remote traceback) or died,
                and no restart absorbed it.
            WorkerTimeoutError: an actor stayed silent longer than ``timeout``.
        """
        self._require("get", Phase.RUNNING)
        if not self._pump("execute", self._segment_deadline, blocking):
            return None, None
        self._complete(self._segment)
        n_running = sum(self._running.values())
        batch = self._read(self._segment, device)
        self._n_running = n_running
        self._phase = Phase.READY
        return batch, n_running

    def _publish_weights(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copies the state_dict to the CPU and puts it ONCE in Ray's object store; every actor
        reads that one object (zero-copy on its node) at the start of its next call."""
        # Let go of the versions this one supersedes before putting it: the object store
        # then reuses their memory (several times faster than fresh pages for 200 MB).
        for pending in self._pending:
            while pending and pending[-1][0] == "weights":
                pending.pop()
        previous, self._last_weights = self._last_weights, None
        try:
            ref = ray.put({k: to_wire(v.detach().contiguous()) for k, v in state_dict.items()})
        except BaseException:
            self._last_weights = previous
            raise
        del previous
        self._last_weights = self._queue(("weights", version, ref))

    def _publish_info(self, version: int, info: Any) -> None:
        """Serialises ``info`` once into Ray's object store; applied in order."""
        self._last_info = self._queue(("info", version, ray.put(to_cpu_bytes(info))))

    def _queue(self, op: Op) -> Op:
        for pending in self._pending:
            pending.append(op)
        return op

    def actors(self) -> list[Any]:
        """The Ray actor handles, by worker index (replacements included)."""
        return list(self._actors)

    def close(self) -> None:
        """Closes every actor's envs and agent (up to about 1 s), then kills every actor; shuts
        Ray down only if this batcher started it (or opened the connection). Idempotent."""
        if self._phase is not Phase.FAILED:
            self._phase = Phase.CLOSED
        self._close_accounting()
        if not hasattr(self, "_finalizer"):
            return
        if self._finalizer.alive and _SESSION is not None:
            _SESSION.kill(self._actors, grace=CLOSE_GRACE_S)
        self._finalizer()
        self._outstanding.clear()

"""The worker pool: what every multi-worker batcher backend decides the same way.

``Batcher`` (worker processes) and ``RayBatcher`` (Ray actors) are both a :class:`WorkerPool`.
The pool owns the decisions; a backend keeps only its transport (start a worker, send it a call,
wait for answers, kill it):

- the constructor: its arguments, every check, the probe of a throwaway env and agent, the
  seeds (``WorkerPool.__init__``; a backend adds its own checks in ``_prepare`` and starts its
  workers in ``_start``);
- the restart policy's bookkeeping: faults, the rows a fault spoils, the delay, the budget
  (:meth:`WorkerPool._absorb`, :meth:`WorkerPool._replace`);
- the errors: a worker's error payload becomes a :class:`WorkerError` naming worker, env and
  step (:func:`worker_error`), a silent worker a :class:`WorkerTimeoutError`
  (:meth:`WorkerPool._timeout`);
- the weights: ``update`` checks every state_dict against the first one and counts versions
  (:meth:`WorkerPool.update`).

A backend implements ``_prepare``, ``_start``, ``_stop_hung``, ``_stop_worker``,
``_start_replacement``, ``_publish_weights`` and ``_publish_info`` (and may add to
``_before_probe``, ``_after_update`` and ``_timeout_hint``).
"""

from __future__ import annotations

import inspect
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import cloudpickle
import psutil
import torch

from rlstruct.agent import Agent
from rlstruct.batchers.base import BatcherBase, Phase, serialized
from rlstruct.batchers.buffer import SlotBuffer, Specs
from rlstruct.batchers.deadlines import Deadlines
from rlstruct.batchers.restart import Fault, RestartPolicy, exhausted, restart_env_seed
from rlstruct.batchers.rollout import infer_specs
from rlstruct.batchers.rows import broadcast_rows
from rlstruct.batchers.seeding import env_seed_bases, isolated_rngs
from rlstruct.batchers.validation import check_picklable, find_non_cpu
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.errors import ConfigError, WorkerError, WorkerTimeoutError
from rlstruct.parallel.weights import WeightSpecs, is_state_dict
from rlstruct.parallel.weights import check_finite as check_finite_weights
from rlstruct.trajectories import Trajectories

__all__ = ["WorkerPool", "pool_arguments", "worker_error", "CLOSE_GRACE_S"]

#: Seconds ``close`` gives workers to leave by themselves (closing their envs and agent) before
#: the next, harder step (SIGTERM then SIGKILL for a process, ``ray.kill`` for an actor).
CLOSE_GRACE_S = 1.0

_Init = TypeVar("_Init", bound=Callable[..., None])

#: ``(create_env, env_args, create_agent, agent_args)``: what every worker builds its env and
#: agent from (pickled into :attr:`~rlstruct.batchers.core.CoreSpec.factories`), and the probe.
Factories = tuple[Callable[..., VecEnv], dict[str, Any], Callable[..., Agent], dict[str, Any]]


def worker_error(payload: Mapping[str, Any], w: int, prefix: str = "") -> WorkerError:
    """The :class:`WorkerError` of worker ``w``'s error payload
    (:func:`rlstruct.batchers.core.error_payload`): ``worker 1, env 7, step 3 during env step:
    RuntimeError: ...``, with the remote traceback."""
    where = [f"worker {payload.get('worker', w)}"]
    if payload.get("env") is not None:
        where.append(f"env {payload['env']}")
    if payload.get("step") is not None:
        where.append(f"step {payload['step']}")
    phase = f" during {payload['phase']}" if payload.get("phase") else ""
    return WorkerError(
        f"{prefix}{', '.join(where)}{phase}: {payload['type']}: {payload['message']}",
        worker=payload.get("worker", w),
        env=payload.get("env"),
        step=payload.get("step"),
        exc_type=payload["type"],
        remote_traceback=payload["traceback"],
    )


def pool_arguments(init: _Init) -> _Init:
    """Decorates a backend's thin ``__init__(self, *args, <its own keyword-only options>,
    **kwargs)``, which hands ``args`` and ``kwargs`` to :meth:`WorkerPool.__init__`: its
    signature, as ``help()``, ``inspect.signature`` and the API reference show it, becomes the
    pool's arguments followed by the backend's own options (the pool's are declared once)."""
    own = [
        p
        for p in inspect.signature(init).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    shared = list(inspect.signature(WorkerPool.__init__).parameters.values())
    init.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        shared + own, return_annotation=inspect.signature(init).return_annotation
    )
    return init


class WorkerPool(BatcherBase):
    """The shared part of the multi-worker batchers (see the module docstring)."""

    restart: RestartPolicy | None = None
    _started = False

    # ------------------------------------------------------------------ construction
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
        adaptive_timeout: bool = False,
        deadline: float | None = None,
    ) -> None:
        """The one constructor of every worker-pool backend (the arguments are documented by
        each backend's class): checks every argument, the backend's own among them
        (:meth:`_prepare`), then probes a throwaway env and agent and derives the seeds, and
        only then asks the backend to start its workers (:meth:`_start`).

        Raises:
            ConfigError: every problem at once, before anything starts.
            TypeError: a factory or argument that cannot be pickled.
        """
        own = self._prepare(device)
        found = self._validate_common(
            n_timesteps, create_agent, agent_args, create_env, env_args, seeds, agent_info, env_info
        )
        found += self._validate_workers(
            n_processes, seeds, agent_seeds, n_threads, restart, timeout, start_timeout
        )
        found += self.validate_pipeline(pipeline) + Deadlines.problems(adaptive_timeout, deadline)
        found += own
        named = {"agent_args": agent_args, "env_args": env_args}
        for name, value in {**named, "agent_info": agent_info, "env_info": env_info}.items():
            found += [f"{where}: {self._NON_CPU}" for where in find_non_cpu(value, name)]
        self._raise_problems(found)
        agent_args, env_args = dict(agent_args or {}), dict(env_args or {})
        check_picklable(create_env=create_env, env_args=env_args)
        check_picklable(create_agent=create_agent, agent_args=agent_args)
        self.n_timesteps, self.n_processes, self.timeout = n_timesteps, n_processes, timeout
        self.deadlines = Deadlines(timeout, adaptive_timeout, deadline, n_processes)  # silences
        self.pipeline, self.restart = pipeline, restart
        self._n_threads, self._start_timeout = n_threads, start_timeout
        factories: Factories = (create_env, env_args, create_agent, agent_args)
        self._before_probe()
        n, step_specs, info_specs = self._probe(factories, agent_info, env_info)
        self._env_bases, default_agent_seeds = env_seed_bases(seeds, n_processes, n)
        self._agent_seeds = list(agent_seeds) if agent_seeds is not None else default_agent_seeds
        self._n_envs, self._n_rows = n, n * n_processes
        self._agent_info_specs = self._agent_info.specs()
        self._env_info_specs = self._env_info.specs()
        self._factories = cloudpickle.dumps(factories)
        self._version = 0
        self._weight_specs: WeightSpecs | None = None
        #: Every worker fault a restart absorbed, oldest first.
        self.faults: list[Fault] = []
        self._restarts = [0] * n_processes  # per worker: seeds of its next replacement
        self._consecutive_faults = 0
        self._spoiled: set[int] = set()  # segments that lost a worker's rows
        self._last_progress = time.monotonic()
        self._done: dict[int, dict[int, int]] = {}  # segment -> {worker: n_running}
        self._release_times: dict[int, float] = {}
        self._released = 0  # id of the next segment to release
        self._next_get = 0  # id of the oldest segment not returned yet
        self._release_owed = False  # pipelined: one release at the next update() or get()
        self._worker_cpu = [0.0] * n_processes  # CPU seconds each worker reported last
        self._external = [False] * n_processes  # runs outside this process tree
        self._retired_cpu = [0.0, 0.0]  # (all, external) of the workers that were replaced
        self._start(device, step_specs, info_specs)
        self._n_running: int | None = None
        self._phase = Phase.NEW
        self._started = True

    #: What a tensor or module not on the CPU in the arguments is told (a backend's words).
    _NON_CPU = "pass CPU tensors/models"

    def _prepare(self, device: DeviceLike) -> list[str]:
        """Sets up what ``close`` needs, before anything can fail; returns the problems of the
        backend's own arguments (``device`` among them), listed with the others."""
        raise NotImplementedError

    def _probe(
        self, factories: Factories, agent_info: DictTensor | None, env_info: DictTensor | None
    ) -> tuple[int, Specs, Specs]:
        """Builds a throwaway env and agent in this process, from the ``factories`` every worker
        gets, to learn ``n`` (envs per worker) and every spec before any worker starts, under
        saved-and-restored generators (the caller's random streams are not consumed); sets
        ``_agent_info``/``_env_info`` to the examples broadcast to ``n * n_processes`` rows.

        Returns:
            ``(n, step_specs, info_specs)``.
        """
        create_env, env_args, create_agent, agent_args = factories
        n_workers = self.n_processes
        with isolated_rngs():
            probe_env = create_env(**env_args, seed=0)
            try:
                if not isinstance(probe_env, VecEnv):
                    raise ConfigError(
                        f"create_env returned a {type(probe_env).__name__}, not a VecEnv"
                    )
                n = probe_env.n_envs()
                probe_agent = create_agent(**agent_args)
                self._agent_info = broadcast_rows(agent_info, n * n_workers, "agent_info")
                self._env_info = broadcast_rows(env_info, n * n_workers, "env_info")
                step_specs, info_specs = infer_specs(
                    probe_env, probe_agent, self._agent_info.slice(0, n), self._env_info.slice(0, n)
                )
                probe_agent.close()
            finally:
                probe_env.close()
        return n, step_specs, info_specs

    def _before_probe(self) -> None:
        """Called once the checks passed, before the probe (e.g. to start something in the
        background while the probe runs)."""

    def _start(self, device: DeviceLike, step_specs: Specs, info_specs: Specs) -> None:
        """Allocates the buffers, starts every worker and waits (within ``start_timeout``) for
        them to be ready; on failure, closes what it started and raises. Sets
        ``startup_seconds``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ CPU accounting
    @property
    def worker_cpu_seconds(self) -> float:
        """CPU seconds the workers used so far, as each reported with its last segment
        (replaced workers included)."""
        return self._retired_cpu[0] + sum(self._worker_cpu)

    def external_cpu_seconds(self) -> float:
        """CPU seconds used so far by this batcher's workers that run OUTSIDE this process's
        tree (Ray actors of another machine, or of a cluster this process did not start), as
        the workers reported them with their segments. A process-tree meter cannot see them:
        :meth:`rlstruct.runs.monitor.ResourceMonitor.watch` adds them. Never decreases
        (replaced workers and a closed batcher keep their share)."""
        live = sum(c for c, ext in zip(self._worker_cpu, self._external) if ext)
        return self._retired_cpu[1] + live

    def _locate(self, w: int, host: str, pid: int) -> None:
        """Records whether worker ``w`` (process ``pid`` on ``host``) runs outside this
        process's tree, where a process-tree meter cannot see it."""
        inside = False
        if host == socket.gethostname():
            try:
                inside = any(p.pid == os.getpid() for p in psutil.Process(pid).parents())
            except psutil.Error:
                inside = False
        self._external[w] = not inside

    def _retire_cpu(self, w: int) -> None:
        """Worker ``w`` is gone: its last report stays in the totals."""
        self._retired_cpu[0] += self._worker_cpu[w]
        if self._external[w]:
            self._retired_cpu[1] += self._worker_cpu[w]
        self._worker_cpu[w], self._external[w] = 0.0, False

    def _core_fields(self, w: int, env_seed: int, device: str) -> dict[str, Any]:
        """The :class:`~rlstruct.batchers.core.CoreSpec` fields of worker ``w`` (a backend's
        spec adds its own)."""
        return {
            "index": w,
            "factories": self._factories,
            "env_seed": env_seed,
            "build_seed": self._agent_seeds[0],  # the same in every worker
            "agent_seed": self._agent_seeds[w],
            "n_envs": self._n_envs,
            "offset": w * self._n_envs,
            "n_timesteps": self.n_timesteps,
            "n_threads": self._n_threads,
            "device": device,
        }

    def _rows(self, w: int) -> slice:
        """Worker ``w``'s rows of a batch."""
        return slice(w * self._n_envs, (w + 1) * self._n_envs)

    # ------------------------------------------------------------------ failures
    def _fail(self, error: WorkerError, hung: Sequence[int] = ()) -> WorkerError:
        """Marks the batcher failed and starts stopping the ``hung`` workers (and asks the others
        to leave) without waiting; ``close()`` (or garbage collection) waits, bounded."""
        self._phase = Phase.FAILED
        self._failure = str(error).split("\n", 1)[0]
        self._stop_hung(hung)
        return error

    def _stop_hung(self, hung: Sequence[int]) -> None:
        raise NotImplementedError

    def _timeout_hint(self, what: str) -> str:
        """Why workers may stay silent during ``what`` (a backend may say more)."""
        return "hung env or agent, or a stopped process?"

    def _timeout(self, workers: Sequence[int], what: str) -> WorkerTimeoutError:
        """The timeout of the silent ``workers`` during ``what``; the batcher fails."""
        silent = sorted(workers)
        limit = (f"the start timeout of {self._start_timeout:g} s"
                 if what in ("start", "restart") else self.deadlines.describe())
        return self._fail(  # type: ignore[return-value]
            WorkerTimeoutError(
                f"workers {silent} did not answer {what} within {limit} "
                f"({self._timeout_hint(what)}); they are being stopped",
                worker=silent[0],
            ),
            hung=silent,
        )

    # ------------------------------------------------------------------ restarts
    def _absorb(self, w: int, error: WorkerError, segments: Sequence[int]) -> WorkerError | None:
        """Replaces worker ``w`` after ``error`` if the restart policy allows it (None), else
        returns the error to raise (saying so when the budget is spent). ``segments``: the
        segments ``w`` owed, whose rows of ``w`` are left out of their batches."""
        policy = self.restart
        if policy is None or not self._started:
            return error
        final = exhausted(policy, error, sum(self._restarts), self._consecutive_faults)
        if final is not None:
            return final
        self._replace(w, error, list(segments))
        return None

    def _replace(self, w: int, error: WorkerError, segments: list[int]) -> None:
        """Stops worker ``w``, records the fault, drops its rows from the segments it owed, and
        starts a fresh one in its place (new env seeds, current weights, envs reset)."""
        assert self.restart is not None
        self._stop_worker(w)
        self._retire_cpu(w)
        self._restarts[w] += 1
        self._consecutive_faults += 1
        self.faults.append(
            Fault(
                worker=w,
                env=error.env,
                step=error.step,
                segment=segments[0] if segments else None,
                exc_type=error.exc_type,
                message=str(error.args[0]).split("\n", 1)[0],
                exitcode=error.exitcode,
                restart=sum(self._restarts),
            )
        )
        for segment in segments:  # never handed to the learner as if valid
            self._slot_buffer(segment).lengths[self._rows(w)] = 0
            self._spoiled.add(segment)
        if self.restart.delay_s:
            time.sleep(self.restart.delay_s)
        seed = restart_env_seed(self._env_bases[w], self._restarts[w])
        self._start_replacement(w, seed, segments)
        self._last_progress = time.monotonic()

    def _stop_worker(self, w: int) -> None:
        """Stops worker ``w`` (faulty) at once."""
        raise NotImplementedError

    def _start_replacement(self, w: int, env_seed: int, segments: list[int]) -> None:
        """Starts worker ``w`` again with ``env_seed``, loads the current weights, resets it."""
        raise NotImplementedError

    def _slot_buffer(self, segment: int) -> SlotBuffer:
        """The buffer that segment ``segment`` is written to."""
        raise NotImplementedError

    # ------------------------------------------------------------------ segments
    def _release(self, new_info: bool = False) -> None:
        """Starts the next segment in every worker, with the newest weights."""
        raise NotImplementedError

    def _start_stream(self, new_info: bool) -> None:
        """``execute``: releases one segment, or ``pipeline`` of them (the stream)."""
        self._last_progress = time.monotonic()
        for i in range(self.pipeline):
            self._release(new_info=new_info and i == 0)
        self._phase = Phase.RUNNING if self.pipeline == 1 else Phase.STREAMING

    def _end_stream(self) -> None:
        """``reset`` while streaming, once the segments in flight were drained: drops them."""
        self._done.clear()
        self._release_times.clear()
        self._next_get, self._release_owed = self._released, False
        self._phase = Phase.READY

    def _segment_deadline(self) -> float:
        """A segment is overdue once its workers were silent for longer than the limit
        (:attr:`deadlines`)."""
        started = self._release_times.get(self._next_get, time.monotonic())
        return self.deadlines.at(max(started, self._last_progress))

    def _delivered(self, segment: int, w: int, n_running: int) -> None:
        """Worker ``w`` delivered ``segment`` with ``n_running`` envs still running."""
        self._done.setdefault(segment, {})[w] = n_running
        self.deadlines.delivered(w, self._release_times.get(segment, time.monotonic()))

    def _hand_over(self, device: DeviceLike | None) -> tuple[Trajectories, int]:
        """``get``, once every worker delivered the oldest segment: its batch and
        ``n_running``; the slot it frees takes the segment ``pipeline`` ahead."""
        segment = self._next_get
        n_running = sum(self._done.pop(segment).values())
        del self._release_times[segment]
        if segment in self._spoiled:
            self._spoiled.discard(segment)
        else:
            self._consecutive_faults = 0  # a complete batch ends a run of faults
        batch = self._read(segment, device)
        self._next_get += 1
        self._n_running = n_running
        if self._phase is Phase.STREAMING:
            self._release_owed = True  # released at the next update() or get()
        else:
            self._phase = Phase.READY
        return batch, n_running

    def _read(self, segment: int, device: DeviceLike | None) -> Trajectories:
        """Segment ``segment``'s batch on ``device`` (default: the CPU); for a GPU, the CPU
        buffers are page-locked once and full segments are copied straight to it."""
        target = None if device is None else torch.device(device)
        if target is not None and target.type == "cuda":
            for buffer in self._buffers():
                buffer.pin()
        return self._slot_buffer(segment).read(device=target)

    def _buffers(self) -> list[SlotBuffer]:
        raise NotImplementedError

    # ------------------------------------------------------------------ weights
    @serialized
    def update(self, info: Any, check_finite: bool = True) -> None:
        """Hands ``info`` (e.g. a model's ``state_dict``, on any device) to every worker's agent.

        A state_dict (a non-empty mapping of str to tensors) must have the keys, shapes and
        dtypes of the first one, and finite values; each worker loads the newest one at the
        start of its next segment, never in the middle of one. Anything else is serialised and
        applied in order. Returns without waiting for the workers; a failure to load surfaces
        at the next ``get``. Every batch records in ``info['policy_version']`` the number of
        updates its rows were collected with (:attr:`version`).

        Threads: ``update`` may be called from any thread. Calls of one batcher from several
        threads take turns (a lock; ``get`` waiting for a segment holds it too), so every
        update counts exactly once and in order.

        Args:
            info: a state_dict, or anything picklable for the agent's ``update``.
            check_finite: refuse a state_dict holding NaN or an infinity (one pass over the
                weights; False skips it, for speed).

        Raises:
            KeyMismatchError: a state_dict with other keys than the first one (named).
            ShapeError: a state_dict entry with another shape or dtype than the first one.
            NonFiniteError: a state_dict with NaN or an infinity (the keys named).
        """
        self._require("update", Phase.NEW, Phase.READY, Phase.RUNNING, Phase.STREAMING)
        version = self._version + 1
        if is_state_dict(info):
            if check_finite:
                check_finite_weights(info)
            if self._weight_specs is None:
                self._weight_specs = WeightSpecs(info)
            else:
                self._weight_specs.check(info)
            self._publish_weights(version, info)
        else:
            self._publish_info(version, info)
        self._version = version
        self._after_update()

    def _publish_weights(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Makes ``state_dict`` (checked) version ``version`` for every worker."""
        raise NotImplementedError

    def _publish_info(self, version: int, info: Any) -> None:
        """Sends ``info`` (not a state_dict) as version ``version`` to every worker."""
        raise NotImplementedError

    def _after_update(self) -> None:
        """Pipelined: a segment owed since the last ``get`` starts with the new version."""
        if self._release_owed:
            self._release()
            self._release_owed = False

    @property
    def version(self) -> int:
        """How many times ``update`` was called."""
        return self._version

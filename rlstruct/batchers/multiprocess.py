"""``Batcher``: CPU worker processes, each with a copy of the agent and many envs.

The slot buffer is allocated once in shared memory before the workers start; worker ``p`` owns
rows ``[p * n, (p + 1) * n)`` (``n`` envs each) and writes its segments there by index. Commands
and tiny replies travel over one pipe per worker. Every wait has a deadline: sends and receives
go through :mod:`rlstruct.batchers.transport`, and waits watch pipes and process sentinels, so a
dead, hung or frozen worker becomes a typed error, never a hang.

Workers are forked from a forkserver process that has torch and rlstruct imported already
(multiprocessing's ``forkserver`` start method with a preload list): the first Batcher of a
program pays for those imports once, later ones start in a fraction of a second. The forkserver
is a fresh single-threaded process, so no CUDA context or thread of the caller is ever forked.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle
import torch
import torch.multiprocessing as tmp

from rlstruct.agent import Agent
from rlstruct.batchers import transport
from rlstruct.batchers.base import BatcherBase, Phase
from rlstruct.batchers.buffer import SlotBuffer
from rlstruct.batchers.rollout import infer_specs
from rlstruct.batchers.rows import broadcast_rows
from rlstruct.batchers.seeding import env_seed_bases, isolated_rngs
from rlstruct.batchers.validation import check_picklable, find_non_cpu
from rlstruct.batchers.worker import Command, Reply, WorkerSpec, worker_main
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.errors import ConfigError, WorkerError, WorkerTimeoutError
from rlstruct.trajectories import Trajectories

__all__ = ["Batcher", "worker_context"]

#: Seconds ``close`` gives workers to leave by themselves (after CLOSE, then after SIGTERM)
#: before the next, harder step.
CLOSE_GRACE_S = 1.0

#: Modules the forkserver imports once, so that workers forked from it start without importing.
PRELOAD = ["rlstruct.batchers.worker", "rlstruct.envs"]


def worker_context(start: bool = False) -> multiprocessing.context.BaseContext:
    """The multiprocessing context workers start from: a forkserver with torch and rlstruct
    preloaded where the platform has one (Linux, macOS), ``spawn`` elsewhere.

    Args:
        start: start the forkserver now if it is not running (it imports its preload list in
            the background while the caller goes on; the first worker start waits for it).
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = tmp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        if start:
            multiprocessing.forkserver.ensure_running()
        return ctx
    return tmp.get_context("spawn")


def _send_close(conns: list[Connection], skip: Sequence[int] = ()) -> None:
    """Asks every worker to leave; never waits more than a few milliseconds in all."""
    deadline = time.monotonic() + 0.05
    for w, conn in enumerate(conns):
        if w not in skip:
            with contextlib.suppress(Exception):  # dead or full pipe: escalation handles it
                transport.send(conn, (Command.CLOSE, None), deadline)


def _shutdown(procs: list[Any], conns: list[Connection], grace: float = CLOSE_GRACE_S) -> None:
    """Stops every worker within about ``3 * grace`` seconds: CLOSE (envs closed), SIGTERM
    (envs closed too, for a worker busy in a segment), then SIGKILL; releases the processes."""
    _send_close(conns)
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for signal_fn in ("terminate", "kill"):
        alive = [p for p in procs if p.is_alive()]
        for proc in alive:
            getattr(proc, signal_fn)()
        deadline = time.monotonic() + grace
        for proc in alive:
            proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if not proc.is_alive():
            proc.close()
    for conn in conns:
        conn.close()
    # The Process objects hold the worker specs, which hold the shared buffer.
    procs.clear()
    conns.clear()


class Batcher(BatcherBase):
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
            reported as hung.
        start_timeout: seconds the workers may take to start.

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
    ) -> None:
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        problems = self._validate_common(
            n_timesteps,
            create_agent,
            agent_args,
            create_env,
            env_args,
            seeds,
            agent_info,
            env_info,
        )
        if isinstance(n_processes, bool) or not isinstance(n_processes, int) or n_processes <= 0:
            problems.append(f"n_processes must be a positive int, got {n_processes!r}")
        elif agent_seeds is not None and len(agent_seeds) != n_processes:
            problems.append(
                f"agent_seeds has {len(agent_seeds)} entries, expected one per process "
                f"({n_processes})"
            )
        if (
            not isinstance(seeds, int)
            and isinstance(seeds, Sequence)
            and isinstance(n_processes, int)
            and len(seeds) != n_processes
        ):
            problems.append(
                f"seeds has {len(seeds)} entries, expected one per process ({n_processes})"
            )
        if torch.device(device).type != "cpu":
            problems.append(
                f"device={device!r}: Batcher workers are CPU-only; use SerialBatcher(device=...) "
                "to collect on a GPU (one process, DeviceEnv)"
            )
        for name, value in (
            ("agent_args", agent_args),
            ("env_args", env_args),
            ("agent_info", agent_info),
            ("env_info", env_info),
        ):
            for where in find_non_cpu(value, name):
                problems.append(
                    f"{where}: Batcher workers are CPU-only; pass CPU tensors/models (the "
                    "batcher copies them) or use SerialBatcher(device=...) for a GPU"
                )
        if not isinstance(n_threads, int) or n_threads <= 0:
            problems.append(f"n_threads must be a positive int, got {n_threads!r}")
        if not timeout > 0 or not start_timeout > 0:
            problems.append(f"timeouts must be > 0, got {timeout!r} and {start_timeout!r}")
        self._raise_problems(problems)
        agent_args, env_args = dict(agent_args or {}), dict(env_args or {})
        check_picklable(
            create_env=create_env,
            env_args=env_args,
            create_agent=create_agent,
            agent_args=agent_args,
        )
        self.n_timesteps, self.n_processes, self.timeout = n_timesteps, n_processes, timeout

        # The forkserver imports torch and rlstruct while the probe runs.
        ctx = worker_context(start=True)
        # A probe env and agent in this process learn n and every spec before any worker
        # starts; whatever they draw from the global generators is given back to the caller.
        with isolated_rngs():
            probe_env = create_env(**env_args, seed=0)
            try:
                if not isinstance(probe_env, VecEnv):
                    raise ConfigError(
                        f"create_env returned a {type(probe_env).__name__}, not a VecEnv"
                    )
                n = probe_env.n_envs()
                probe_agent = create_agent(**agent_args)
                self._agent_info = broadcast_rows(agent_info, n * n_processes, "agent_info")
                self._env_info = broadcast_rows(env_info, n * n_processes, "env_info")
                step_specs, info_specs = infer_specs(
                    probe_env, probe_agent, self._agent_info.slice(0, n), self._env_info.slice(0, n)
                )
                probe_agent.close()
            finally:
                probe_env.close()
        env_bases, default_agent_seeds = env_seed_bases(seeds, n_processes, n)
        agent_seeds = list(agent_seeds) if agent_seeds is not None else default_agent_seeds
        self._n_envs, self._n_rows = n, n * n_processes
        self._agent_info_specs = self._agent_info.specs()
        self._env_info_specs = self._env_info.specs()
        self.buffer = SlotBuffer(self._n_rows, n_timesteps, step_specs, info_specs, shared=True)
        self._agent_info_in = {k: v.clone().share_memory_() for k, v in self._agent_info.items()}
        self._env_info_in = {k: v.clone().share_memory_() for k, v in self._env_info.items()}

        factories = cloudpickle.dumps((create_env, env_args, create_agent, agent_args))
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns)
        started = time.monotonic()
        for p in range(n_processes):
            spec = WorkerSpec(
                index=p,
                factories=factories,
                env_seed=env_bases[p],
                build_seed=agent_seeds[0],
                agent_seed=agent_seeds[p],
                n_envs=n,
                offset=p * n,
                n_timesteps=n_timesteps,
                n_threads=n_threads,
                buffer=self.buffer,
                agent_info_in=self._agent_info_in,
                env_info_in=self._env_info_in,
            )
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=worker_main,
                args=(spec, child_conn),
                daemon=True,
                name=f"rlstruct-worker-{p}",
            )
            proc.start()
            child_conn.close()
            self._procs.append(proc)
            self._conns.append(parent_conn)
        self._version = 0
        self._pending: dict[int, Any] = {w: Reply.READY for w in range(n_processes)}
        self._results: dict[int, Any] = {}
        self._deferred_update: bytes | None = None
        self._deadline = 0.0
        try:
            self._collect(Reply.READY, started + start_timeout, "start")
        except BaseException:
            self.close()  # nobody gets this object to close it: stop the workers now
            raise
        self.startup_seconds = time.monotonic() - started
        self._n_running: int | None = None
        self._phase = Phase.NEW

    # ------------------------------------------------------------------ waiting
    def _fail(self, error: WorkerError, hung: Sequence[int] = ()) -> WorkerError:
        """Marks the batcher failed and starts stopping the workers without waiting for them:
        CLOSE to the healthy ones (they close their envs), SIGTERM to the ``hung`` ones.
        ``close()`` (or garbage collection) waits for them, bounded."""
        self._phase = Phase.FAILED
        self._failure = str(error).split("\n", 1)[0]
        _send_close(self._conns, skip=hung)
        for w in hung:
            with contextlib.suppress(Exception):
                self._procs[w].terminate()
        return error

    def _timeout(self, workers: Sequence[int], what: str) -> WorkerTimeoutError:
        silent = sorted(workers)
        return self._fail(
            WorkerTimeoutError(
                f"workers {silent} did not answer {what} within the timeout "
                f"({self.timeout:g} s; hung env or agent, or a "
                "stopped process?); they are being stopped",
                worker=silent[0],
            ),
            hung=silent,
        )

    def _handle(self, w: int, message: tuple[Reply, Any], expect: Reply) -> None:
        kind, payload = message
        if kind is Reply.ERROR:
            where = [f"worker {payload.get('worker', w)}"]
            if payload.get("env") is not None:
                where.append(f"env {payload['env']}")
            if payload.get("step") is not None:
                where.append(f"step {payload['step']}")
            phase = f" during {payload['phase']}" if payload.get("phase") else ""
            raise self._fail(
                WorkerError(
                    f"{', '.join(where)}{phase}: {payload['type']}: {payload['message']}",
                    worker=payload.get("worker", w),
                    env=payload.get("env"),
                    step=payload.get("step"),
                    exc_type=payload["type"],
                    remote_traceback=payload["traceback"],
                )
            )
        if kind is expect:
            self._results[w] = payload
            self._pending.pop(w, None)

    def _poll(self, w: int, expect: Reply, deadline: float, what: str) -> None:
        conn = self._conns[w]
        while w in self._pending and conn.poll():
            try:
                message = transport.recv(conn, deadline)
            except (EOFError, OSError):
                break
            except TimeoutError:
                raise self._timeout([w], what) from None
            self._handle(w, message, expect)

    def _collect(self, expect: Reply, deadline: float, what: str, blocking: bool = True) -> bool:
        """Waits (until ``deadline``) for ``expect`` from every worker; False if not blocking
        and some are still busy. Dead or silent workers raise at once, without waiting for
        the other workers to stop (``close`` does that)."""
        while True:
            for w in list(self._pending):
                self._poll(w, expect, deadline, what)
                proc = self._procs[w]
                if w in self._pending and not proc.is_alive():
                    self._poll(w, expect, deadline, what)  # a last message before death
                    if w in self._pending:
                        hint = (
                            "; its stderr says why (common causes: the worker could not import "
                            "something, or a script starts a Batcher without an "
                            "`if __name__ == '__main__':` guard)"
                            if what == "start"
                            else ""
                        )
                        raise self._fail(
                            WorkerError(
                                f"worker {w} died during {what} with exit code "
                                f"{proc.exitcode}{hint}",
                                worker=w,
                                exitcode=proc.exitcode,
                            )
                        )
            if not self._pending:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout(list(self._pending), what)
            if not blocking:
                return False
            watch = [self._conns[w] for w in self._pending]
            watch += [self._procs[w].sentinel for w in self._pending]
            wait(watch, timeout=min(remaining, 1.0))

    def _send_all(self, command: Command, arg: Any, expect: Reply, what: str) -> None:
        self._results = {}
        self._pending = {w: expect for w in range(len(self._procs))}
        deadline = time.monotonic() + self.timeout
        for w, conn in enumerate(self._conns):
            try:
                transport.send(conn, (command, arg), deadline)
            except TimeoutError:
                raise self._timeout([w], what) from None
            except OSError:
                pass  # a dead worker's pipe is broken: _collect reports it with its exit code

    # ------------------------------------------------------------------ API
    def reset(
        self, agent_info: DictTensor | None = None, env_info: DictTensor | None = None
    ) -> None:
        """Resets every env (with ``env_info``) and every row's agent state and agent_info.

        Args:
            agent_info: DictTensor with 1 or B rows; default: the constructor's example.
            env_info: DictTensor with 1 or B rows; default: the constructor's example.
        """
        self._require("reset", Phase.NEW, Phase.READY)
        ai = self._rows_info(agent_info, self._agent_info, self._agent_info_specs, "agent_info")
        ei = self._rows_info(env_info, self._env_info, self._env_info_specs, "env_info")
        for k, v in ai.items():
            self._agent_info_in[k].copy_(v)
        for k, v in ei.items():
            self._env_info_in[k].copy_(v)
        self._send_all(Command.RESET, None, Reply.RESET_DONE, "reset")
        self._collect(Reply.RESET_DONE, time.monotonic() + self.timeout, "reset")
        self._n_running = sum(self._results.values())
        self._phase = Phase.READY

    def execute(self, agent_info: DictTensor | None = None) -> None:
        """Starts collecting one segment in every worker and returns at once.

        Args:
            agent_info: new per-row agent_info (1 or B rows) used from now on by running rows.

        Raises:
            BatcherStateError: not after ``reset``/``get`` (e.g. a second ``execute``).
        """
        self._require("execute", Phase.READY)
        self._require_running_envs()
        if agent_info is not None:
            ai = self._rows_info(agent_info, self._agent_info, self._agent_info_specs, "agent_info")
            for k, v in ai.items():
                self._agent_info_in[k].copy_(v)
        self._send_all(Command.EXECUTE, agent_info is not None, Reply.DONE, "execute")
        self._deadline = time.monotonic() + self.timeout
        self._phase = Phase.RUNNING

    def get(self, blocking: bool = True) -> tuple[Trajectories | None, int | None]:
        """The segment started by ``execute``: ``(Trajectories, n_still_running)`` on the CPU.

        Args:
            blocking: wait for the segment; when False, return ``(None, None)`` while it is
                still being collected.

        Raises:
            WorkerError: a worker raised (with worker, env, step and remote traceback) or died.
            WorkerTimeoutError: a worker stayed silent longer than ``timeout``.
        """
        self._require("get", Phase.RUNNING)
        if not self._collect(Reply.DONE, self._deadline, "execute", blocking):
            return None, None
        n_running = sum(self._results.values())
        self._results = {}
        self._n_running = n_running
        batch = self.buffer.read()
        self._phase = Phase.READY
        if self._deferred_update is not None:
            blob, self._deferred_update = self._deferred_update, None
            self._push_update(blob)
        return batch, n_running

    def update(self, info: Any) -> None:
        """Sends ``info`` (e.g. a model's ``state_dict``, on any device) to every worker's agent.

        Tensors travel through the CPU. Called between segments, it returns once every worker
        has loaded it; called while a segment is in flight, it is applied right after that
        segment (never in the middle of one). Every batch records in ``info['policy_version']``
        the number of updates its rows were collected with.
        """
        self._require("update", Phase.NEW, Phase.READY, Phase.RUNNING)
        self._version += 1
        blob = transport.to_cpu_bytes(info)
        if self._phase is Phase.RUNNING:
            self._deferred_update = blob
        else:
            self._push_update(blob)

    def _push_update(self, blob: bytes) -> None:
        self._send_all(Command.UPDATE, (self._version, blob), Reply.UPDATED, "update")
        self._collect(Reply.UPDATED, time.monotonic() + self.timeout, "update")
        self._results = {}

    @property
    def version(self) -> int:
        """How many times ``update`` was called."""
        return self._version

    def close(self) -> None:
        """Stops every worker and frees the shared buffer: idempotent, bounded (about 3 s).

        Workers are asked to leave first (they close their envs and agent), then sent SIGTERM
        (an orderly exit too, for a worker busy in a segment), then SIGKILL. The shared-memory
        buffer is released here, not when the Batcher object is garbage collected; batches
        already returned by ``get`` are copies and stay valid.
        """
        if self._phase is not Phase.FAILED:
            self._phase = Phase.CLOSED
        if hasattr(self, "_finalizer"):
            self._finalizer()
        self.buffer = None  # type: ignore[assignment]
        self._agent_info_in, self._env_info_in = {}, {}

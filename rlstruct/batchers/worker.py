"""The worker side of ``Batcher``: command Enum, module-level worker function, structured errors.

Protocol (one duplex pipe per worker; the parent may queue several commands, the worker takes
them in order):

    parent -> worker                                 worker -> parent
    (RESET, None)                                    (RESET_DONE, n_running)
    (EXECUTE, (slot, policy_version, load, new_info)) (DONE, (slot, n_running))
    (WEIGHTS, (SharedWeights, load))                 -- (the ring, sent once; a replacement
                                                      loads version ``load`` at once)
    (UPDATE, (version, blob))                        -- (non-tensor info, applied in order)
    (CLOSE, None)                                    -- the worker exits
    any failure                                      (ERROR, {type, message, traceback, worker,
                                                      env, step, phase})

``EXECUTE`` collects one segment into buffer slot ``slot``, after loading weights version
``load`` from the ring when ``load`` is not None (so weights change only between segments).

The worker seeds its process's global generators (torch, numpy, ``random``) with the build seed
(the same in every worker) before it builds its env and its agent, then with its own agent seed,
so models initialised in ``create_agent`` are the same in every worker and every run, and agents
that sample from the global generators are reproducible. It ignores SIGINT (the main process
owns shutdown), turns SIGTERM into an orderly exit (env and agent closed, so envs that own
helper processes release them), asks the kernel to kill it when its parent dies (Linux), and
exits when its pipe reaches EOF.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import cloudpickle
import torch

from rlstruct.batchers.buffer import SlotBuffer
from rlstruct.batchers.rollout import Rollout, StepContext
from rlstruct.batchers.seeding import seed_global_rngs
from rlstruct.batchers.transport import from_cpu_bytes
from rlstruct.batchers.weights import SharedWeights
from rlstruct.dicttensor import DictTensor

__all__ = ["Command", "Reply", "WorkerSpec", "worker_main"]


class Command(enum.Enum):
    """What the parent asks a worker to do."""

    RESET = 1
    EXECUTE = 2
    UPDATE = 3
    CLOSE = 4
    WEIGHTS = 5


class Reply(enum.Enum):
    """What a worker answers."""

    READY = 1
    RESET_DONE = 2
    DONE = 3
    ERROR = 5


@dataclass
class WorkerSpec:
    """Everything a worker needs, sent once at spawn (shared tensors travel as handles)."""

    index: int
    factories: bytes  # cloudpickle of (create_env, env_args, create_agent, agent_args)
    env_seed: int
    build_seed: int  # the global generators' seed while env and agent are built (same for all)
    agent_seed: int  # then: this worker's own stream, for everything the agent samples
    n_envs: int
    offset: int
    n_timesteps: int
    n_threads: int
    buffers: list[SlotBuffer]  # one per segment slot
    agent_info_in: dict[str, torch.Tensor]  # (R, ...) shared, written by the parent
    env_info_in: dict[str, torch.Tensor]


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (belt and braces with pipe EOF)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class _Terminate(BaseException):
    """Raised by the SIGTERM handler: leave through the orderly exit (envs closed)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminate()


def _describe(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception cannot even describe itself."""
    try:
        return str(exc)
    except BaseException as e:  # a broken __str__ must not kill the report
        return f"<{type(exc).__name__}.__str__ raised {type(e).__name__}>"


def _format_traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:
        frames = "".join(traceback.format_tb(exc.__traceback__))
        head = "Traceback (most recent call last):\n"
        return f"{head}{frames}{type(exc).__name__}: {_describe(exc)}\n"


def _error_payload(exc: BaseException, worker: int, rollout: Rollout | None) -> dict[str, Any]:
    where = rollout.describe_failure(exc) if rollout is not None else {"worker": worker}
    ctx = getattr(exc, "rlstruct_context", None)
    if rollout is None and ctx is not None:
        where.update(env=ctx.env, step=ctx.step, phase=ctx.phase)
    return {
        "type": type(exc).__name__,
        "message": _describe(exc),
        "traceback": _format_traceback(exc),
        **where,
    }


def _rows(tensors: dict[str, torch.Tensor], spec: WorkerSpec) -> DictTensor:
    sl = slice(spec.offset, spec.offset + spec.n_envs)
    return DictTensor._trusted(
        {k: v[sl].clone() for k, v in tensors.items()}, spec.n_envs, torch.device("cpu")
    )


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a worker process (module level, so spawn can import it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    _die_with_parent()
    torch.set_num_threads(spec.n_threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.n_threads))
    rollout: Rollout | None = None
    env = agent = None
    try:
        # Before anything user-written runs: a model built in create_agent gets the same
        # weights in every worker and every run, then the agent samples from its own stream.
        seed_global_rngs(spec.build_seed)
        try:
            create_env, env_args, create_agent, agent_args = cloudpickle.loads(spec.factories)
            env = create_env(**env_args, seed=spec.env_seed)
        except Exception as e:
            e.rlstruct_context = StepContext("env factory", None, None)  # type: ignore[attr-defined]
            raise
        if env.n_envs() != spec.n_envs:
            raise ValueError(
                f"worker {spec.index}: create_env built {env.n_envs()} envs, expected "
                f"{spec.n_envs} like the first one (every worker must own the same number)"
            )
        try:
            agent = create_agent(**agent_args)
            agent.seed(spec.agent_seed)
        except Exception as e:
            e.rlstruct_context = StepContext("agent factory", None, None)  # type: ignore[attr-defined]
            raise
        seed_global_rngs(spec.agent_seed)
        rollout = Rollout(env, agent, spec.buffers[0], spec.offset, worker=spec.index)
        conn.send((Reply.READY, None))
    except _Terminate:
        _exit(env, agent, conn)
    except BaseException as e:
        _send_quietly(conn, (Reply.ERROR, _error_payload(e, spec.index, None)))
        _exit(env, agent, conn)

    with contextlib.suppress(_Terminate):
        _serve(spec, conn, rollout, agent)
    _exit(env, agent, conn)


def _serve(spec: WorkerSpec, conn: Connection, rollout: Rollout, agent: Any) -> None:
    """Answers the parent's commands until CLOSE, EOF or SIGTERM."""
    failed = False
    weights: SharedWeights | None = None
    staging: dict[str, torch.Tensor] = {}
    while True:
        try:
            command, arg = conn.recv()
        except _Terminate:
            raise
        except Exception:
            break  # the parent is gone (EOF), or a message cut by a timed-out send
        if command is Command.CLOSE:
            break
        if failed:
            continue  # after a failure only CLOSE is honoured; the parent tears everything down
        try:
            if command is Command.RESET:
                rollout.reset(_rows(spec.agent_info_in, spec), _rows(spec.env_info_in, spec))
                conn.send((Reply.RESET_DONE, rollout.n_running))
            elif command is Command.EXECUTE:
                slot, version, load, new_info = arg
                if load is not None:
                    assert weights is not None, "EXECUTE with a load before WEIGHTS"
                    weights.read_into(load, staging)
                    try:
                        agent.update(staging)
                    except Exception as e:
                        e.rlstruct_context = StepContext("agent update", None, None)  # type: ignore[attr-defined]
                        raise
                rollout.version = version
                if new_info:
                    rollout.set_agent_info(_rows(spec.agent_info_in, spec))
                rollout.buffer = spec.buffers[slot]
                conn.send((Reply.DONE, (slot, rollout.run(spec.n_timesteps))))
            elif command is Command.WEIGHTS:
                weights, load = arg
                staging = weights.staging()
                if load is not None:  # a replacement worker catches up at once
                    weights.read_into(load, staging)
                    agent.update(staging)
            elif command is Command.UPDATE:
                version, blob = arg
                try:
                    agent.update(from_cpu_bytes(blob))
                except Exception as e:
                    e.rlstruct_context = StepContext("agent update", None, None)  # type: ignore[attr-defined]
                    raise
                rollout.version = version
        except (BrokenPipeError, EOFError):
            break
        except _Terminate:
            raise
        except BaseException as e:
            failed = True
            if not _send_quietly(conn, (Reply.ERROR, _error_payload(e, spec.index, rollout))):
                break


def _exit(env: Any, agent: Any, conn: Connection) -> NoReturn:
    """Closes everything, then leaves at once: the interpreter's own teardown (torch's, mostly)
    takes about a second and would make every ``close()`` wait for it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut close() short
    _close_quietly(env, agent, conn)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _send_quietly(conn: Connection, message: Any) -> bool:
    try:
        conn.send(message)
        return True
    except Exception:
        return False


def _close_quietly(env: Any, agent: Any, conn: Connection) -> None:
    for obj in (env, agent, conn):
        try:
            if obj is not None:
                obj.close()
        except Exception:
            pass

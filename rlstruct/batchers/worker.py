"""The worker side of ``Batcher``: command Enum, module-level worker function, structured errors.

Protocol (one duplex pipe per worker; the parent sends commands, the worker answers each):

    parent -> worker          worker -> parent
    (RESET, None)             (RESET_DONE, n_running)
    (EXECUTE, use_new_info)   (DONE, n_running)
    (UPDATE, (version, blob)) (UPDATED, version)
    (CLOSE, None)             -- the worker exits
    any failure               (ERROR, {type, message, traceback, worker, env, step, phase})

The worker ignores SIGINT (the main process owns shutdown), asks the kernel to kill it when the
parent dies (Linux), and exits when its pipe reaches EOF.
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
from rlstruct.batchers.config import from_cpu_bytes
from rlstruct.batchers.rollout import Rollout, StepContext
from rlstruct.dicttensor import DictTensor

__all__ = ["Command", "Reply", "WorkerSpec", "worker_main"]


class Command(enum.Enum):
    """What the parent asks a worker to do."""

    RESET = 1
    EXECUTE = 2
    UPDATE = 3
    CLOSE = 4


class Reply(enum.Enum):
    """What a worker answers."""

    READY = 1
    RESET_DONE = 2
    DONE = 3
    UPDATED = 4
    ERROR = 5


@dataclass
class WorkerSpec:
    """Everything a worker needs, sent once at spawn (shared tensors travel as handles)."""

    index: int
    factories: bytes  # cloudpickle of (create_env, env_args, create_agent, agent_args)
    env_seed: int
    agent_seed: int
    n_envs: int
    offset: int
    n_timesteps: int
    n_threads: int
    buffer: SlotBuffer
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


def _error_payload(exc: BaseException, worker: int, rollout: Rollout | None) -> dict[str, Any]:
    where = rollout.describe_failure(exc) if rollout is not None else {"worker": worker}
    ctx = getattr(exc, "rlstruct_context", None)
    if rollout is None and ctx is not None:
        where.update(env=ctx.env, step=ctx.step, phase=ctx.phase)
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
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
    _die_with_parent()
    torch.set_num_threads(spec.n_threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.n_threads))
    rollout: Rollout | None = None
    env = agent = None
    try:
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
        rollout = Rollout(env, agent, spec.buffer, spec.offset, worker=spec.index)
        conn.send((Reply.READY, None))
    except BaseException as e:
        _send_quietly(conn, (Reply.ERROR, _error_payload(e, spec.index, None)))
        _exit(env, agent, conn)

    failed = False
    while True:
        try:
            command, arg = conn.recv()
        except (EOFError, OSError):
            break  # the parent is gone
        if command is Command.CLOSE:
            break
        if failed:
            continue  # after a failure only CLOSE is honoured; the parent tears everything down
        try:
            if command is Command.RESET:
                rollout.reset(_rows(spec.agent_info_in, spec), _rows(spec.env_info_in, spec))
                conn.send((Reply.RESET_DONE, rollout.n_running))
            elif command is Command.EXECUTE:
                if arg:
                    rollout.set_agent_info(_rows(spec.agent_info_in, spec))
                conn.send((Reply.DONE, rollout.run(spec.n_timesteps)))
            elif command is Command.UPDATE:
                version, blob = arg
                agent.update(from_cpu_bytes(blob))
                rollout.version = version
                conn.send((Reply.UPDATED, version))
        except (BrokenPipeError, EOFError):
            break
        except BaseException as e:
            failed = True
            if not _send_quietly(conn, (Reply.ERROR, _error_payload(e, spec.index, rollout))):
                break
    _exit(env, agent, conn)


def _exit(env: Any, agent: Any, conn: Connection) -> NoReturn:
    """Closes everything, then leaves at once: the interpreter's own teardown (torch's, mostly)
    takes about a second and would make every ``close()`` wait for it."""
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

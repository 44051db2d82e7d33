"""The worker side of ``Batcher``: command Enum, module-level worker function, structured errors.

Protocol (one duplex pipe per worker; the parent may queue several commands, the worker takes
them in order)::

    parent -> worker                                 worker -> parent
    (RESET, None)                                    (RESET_DONE, n_running)
    (EXECUTE, (slot, policy_version, load, new_info)) (DONE, (slot, n_running, cpu_s))
    (WEIGHTS, (SharedWeights, load))                 -- (the ring, sent once; a replacement
                                                      loads version ``load`` at once)
    (UPDATE, (version, blob))                        -- (non-tensor info, applied in order)
    (CLOSE, None)                                    -- the worker exits
    any failure                                      (ERROR, {type, message, traceback, worker,
                                                      env, step, phase})

``EXECUTE`` collects one segment into buffer slot ``slot``, after loading weights version
``load`` from the ring when ``load`` is not None (so weights change only between segments).

The worker serves a :class:`~rlstruct.batchers.core.WorkerCore` (which builds, seeds, loads and
collects exactly as a Ray actor's does). It ignores SIGINT (the main process owns shutdown),
turns SIGTERM into an orderly exit (env and agent closed, so envs that own helper processes
release them), asks the kernel to kill it when its parent dies (Linux), exits when its pipe
reaches EOF, and at once when the driver is gone, whatever it is doing (a watchdog thread,
:func:`rlstruct.parallel.startup.watch_driver`: a forkserver's child outlives a SIGKILLed
driver otherwise, and a worker stuck in ``env.step`` never reads the EOF).
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import torch

from rlstruct.batchers.buffer import SlotBuffer
from rlstruct.batchers.core import CoreSpec, WorkerCore, error_payload
from rlstruct.dicttensor import DictTensor
from rlstruct.parallel.startup import forget_safe_path, ignore_ctrl_c, watch_driver
from rlstruct.parallel.weights import SharedWeights

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
class WorkerSpec(CoreSpec):
    """Everything a process worker needs, sent once at spawn (shared tensors travel as handles)."""

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


def _rows(tensors: dict[str, torch.Tensor], spec: WorkerSpec) -> DictTensor:
    sl = slice(spec.offset, spec.offset + spec.n_envs)
    return DictTensor.trusted(
        {k: v[sl].clone() for k, v in tensors.items()}, spec.n_envs, torch.device("cpu")
    )


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a worker process (module level, so spawn can import it)."""
    ignore_ctrl_c()  # SIGINT was blocked from birth (rlstruct.parallel.startup)
    signal.signal(signal.SIGTERM, _on_sigterm)
    _die_with_parent()
    watch_driver()  # the driver SIGKILLed: leave, even from inside env.step
    forget_safe_path()  # spawn: the env's own processes see the user's environment
    torch.set_num_threads(spec.n_threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.n_threads))
    core = WorkerCore(spec, spec.buffers[0], spec.offset)
    try:
        core.build()
        conn.send((Reply.READY, None))
    except _Terminate:
        _exit(core, conn)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        _send_quietly(conn, (Reply.ERROR, error_payload(e, spec.index, None)))
        _exit(core, conn)

    with contextlib.suppress(_Terminate):
        _serve(spec, conn, core)
    _exit(core, conn)


def _serve(spec: WorkerSpec, conn: Connection, core: WorkerCore) -> None:
    """Answers the parent's commands until CLOSE, EOF or SIGTERM."""
    failed = False
    weights: SharedWeights | None = None
    staging: dict[str, torch.Tensor] = {}
    while True:
        try:
            command, arg = conn.recv()
        except _Terminate:
            raise
        except Exception:  # noqa: BLE001 - the parent is gone (EOF), or a message cut by a
            break  # timed-out send: nobody to report to, the worker leaves
        if command is Command.CLOSE:
            break
        if failed:
            continue  # after a failure only CLOSE is honoured; the parent tears everything down
        try:
            if command is Command.RESET:
                n_running = core.reset(
                    _rows(spec.agent_info_in, spec), _rows(spec.env_info_in, spec)
                )
                conn.send((Reply.RESET_DONE, n_running))
            elif command is Command.EXECUTE:
                slot, version, load, new_info = arg
                if load is not None:
                    assert weights is not None, "EXECUTE with a load before WEIGHTS"
                    weights.read_into(load, staging)
                    core.load(staging)
                info = _rows(spec.agent_info_in, spec) if new_info else None
                n_running = core.collect(spec.buffers[slot], version, info)
                conn.send((Reply.DONE, (slot, n_running, core.cpu_seconds())))
            elif command is Command.WEIGHTS:
                weights, load = arg
                staging = weights.staging()
                if load is not None:  # a replacement worker catches up at once
                    weights.read_into(load, staging)
                    core.load(staging)
            elif command is Command.UPDATE:
                version, blob = arg
                core.apply(blob)
                core.rollout.version = version  # type: ignore[union-attr]
        except (BrokenPipeError, EOFError):
            break
        except _Terminate:
            raise
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
            failed = True
            if not _send_quietly(conn, (Reply.ERROR, core.error_payload(e))):
                break


def _exit(core: WorkerCore, conn: Connection) -> NoReturn:
    """Closes everything, then leaves at once: the interpreter's own teardown (torch's, mostly)
    takes about a second and would make every ``close()`` wait for it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut close() short
    core.close()
    with contextlib.suppress(Exception):  # leaving anyway: a dead pipe changes nothing
        conn.close()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing to flush to
            stream.flush()
    os._exit(0)


def _send_quietly(conn: Connection, message: Any) -> bool:
    try:
        conn.send(message)
        return True
    except Exception:  # noqa: BLE001 - a dead pipe (or an unpicklable report): the caller
        return False  # sees False and leaves; the parent reports the worker as dead

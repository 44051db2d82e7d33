"""How the worker processes of ``Batcher`` are started, awaited, reported dead and stopped (the
context they start from is :func:`rlstruct.parallel.context.worker_context`, shared with the
learner ranks).

Every wait is bounded: a replacement's start by its deadline; stopping by CLOSE, then SIGTERM,
then SIGKILL, each after a grace period.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from typing import Any

from rlstruct.batchers.pool import CLOSE_GRACE_S
from rlstruct.batchers.process.worker import Command, Reply, WorkerSpec, worker_main
from rlstruct.errors import WorkerError
from rlstruct.parallel import transport
from rlstruct.parallel.startup import starting_children

__all__ = ["WORKER_PRELOAD", "send_close", "shutdown", "start_worker", "await_ready",
           "death_error"]

#: What the forkserver imports once for the workers of a Batcher and the learner ranks
#: (:func:`~rlstruct.parallel.context.worker_context`'s ``preload``).
WORKER_PRELOAD = ("rlstruct.batchers.process.worker", "rlstruct.envs")


def start_worker(ctx: BaseContext, spec: WorkerSpec, p: int) -> tuple[Any, Connection]:
    """Starts worker ``p``'s process from ``ctx``.

    Args:
        ctx: the multiprocessing context (the forkserver, or spawn).
        spec: what the worker builds and serves.
        p: the worker's index (in its process name).

    Returns:
        ``(process, the batcher's end of its duplex pipe)``.
    """
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    proc = ctx.Process(
        target=worker_main, args=(spec, child_conn), daemon=True, name=f"rlstruct-worker-{p}"
    )
    with starting_children():  # spawn: the child ignores Ctrl-C from its first line on
        proc.start()
    child_conn.close()
    return proc, parent_conn


def await_ready(w: int, conn: Connection, proc: Any, deadline: float) -> WorkerError | None:
    """Waits for the READY of worker ``w``'s replacement (process ``proc``, pipe ``conn``).

    Args:
        w: the worker's index.
        conn: the batcher's end of its pipe.
        proc: its process.
        deadline: ``time.monotonic()`` by which READY must have come.

    Returns:
        None once READY came; the error to raise when its factories raised or it died while
        starting.

    Raises:
        TimeoutError: nothing came by ``deadline``.
    """
    while True:
        if conn.poll():
            kind, payload = transport.recv(conn, deadline)
            if kind is Reply.READY:
                return None
            return WorkerError(
                f"the replacement of worker {w} failed while starting: "
                f"{payload['type']}: {payload['message']}",
                worker=w,
                exc_type=payload["type"],
                remote_traceback=payload["traceback"],
            )
        if not proc.is_alive():
            return WorkerError(
                f"the replacement of worker {w} died while starting (exit code "
                f"{proc.exitcode})",
                worker=w,
                exitcode=proc.exitcode,
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"the replacement of worker {w} did not start in time")
        wait([conn, proc.sentinel], timeout=min(1.0, max(0.0, deadline - time.monotonic())))


def death_error(w: int, proc: Any, what: str) -> WorkerError:
    """The error of worker ``w``, whose process ``proc`` died during ``what`` (at ``"start"``,
    with the common causes)."""
    hint = (
        "; its stderr says why (common causes: the worker could not import "
        "something, or a script starts a Batcher without an "
        "`if __name__ == '__main__':` guard)"
        if what == "start"
        else ""
    )
    return WorkerError(
        f"worker {w} died during {what} with exit code {proc.exitcode}{hint}",
        worker=w,
        exitcode=proc.exitcode,
    )


def send_close(conns: list[Connection], skip: Sequence[int] = ()) -> None:
    """Asks every worker to leave; never waits more than a few milliseconds in all."""
    deadline = time.monotonic() + 0.05
    for w, conn in enumerate(conns):
        if w not in skip:
            with contextlib.suppress(Exception):  # dead or full pipe: escalation handles it
                transport.send(conn, (Command.CLOSE, None), deadline)


def shutdown(procs: list[Any], conns: list[Connection], grace: float = CLOSE_GRACE_S) -> None:
    """Stops every worker within about ``3 * grace`` seconds: CLOSE (envs closed), SIGTERM
    (envs closed too, for a worker busy in a segment), then SIGKILL; releases the processes."""
    send_close(conns)
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

"""How the worker processes of ``Batcher`` are stopped (the context they start from is
:func:`rlstruct.parallel.context.worker_context`, shared with the learner ranks).

Stopping is bounded: CLOSE, then SIGTERM, then SIGKILL, each after a grace period.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from rlstruct.batchers.pool import CLOSE_GRACE_S
from rlstruct.batchers.process.worker import Command
from rlstruct.parallel import transport

__all__ = ["WORKER_PRELOAD", "send_close", "shutdown"]

#: What the forkserver imports once for the workers of a Batcher and the learner ranks
#: (:func:`~rlstruct.parallel.context.worker_context`'s ``preload``).
WORKER_PRELOAD = ("rlstruct.batchers.process.worker", "rlstruct.envs")

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

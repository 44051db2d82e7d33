"""Worker processes of ``Batcher``: the context they start from, and how they are stopped.

Workers are forked from a forkserver process that has torch and rlstruct imported already
(multiprocessing's ``forkserver`` start method with a preload list): the first Batcher of a
program pays for those imports once, later ones start in a fraction of a second. The forkserver
is a fresh single-threaded process, so no CUDA context or thread of the caller is ever forked.
Stopping is bounded: CLOSE, then SIGTERM, then SIGKILL, each after a grace period.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import torch.multiprocessing as tmp

from rlstruct.batchers import transport
from rlstruct.batchers.pool import CLOSE_GRACE_S
from rlstruct.batchers.worker import Command

__all__ = ["worker_context", "send_close", "shutdown", "FORKSERVER_MAX_FDS", "PRELOAD"]

#: The forkserver hands at most 256 descriptors to a new process (multiprocessing's limit);
#: a buffer with more shared tensors starts its workers with ``spawn`` instead.
FORKSERVER_MAX_FDS = 240

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

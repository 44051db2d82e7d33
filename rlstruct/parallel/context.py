"""The multiprocessing context every rlstruct process starts from: batcher workers and learner
ranks alike.

Processes are forked from a forkserver process that has torch and rlstruct imported already
(multiprocessing's ``forkserver`` start method with a preload list): the first Batcher of a
program pays for those imports once, later ones start in a fraction of a second. The forkserver
is a fresh single-threaded process, so no CUDA context or thread of the caller is ever forked.

The forkserver ignores SIGTERM, and SIGINT from its first line on (it is started with SIGINT
blocked, which its children inherit; :func:`rlstruct.parallel.startup.starting_children`, which
also keeps the working directory off its ``sys.path``): it ends when the program that started
it does. A signal to the whole process group (Slurm at a time limit,
``timeout``, ``kill -TERM -PGID``) would otherwise kill it, and every live worker and learner
rank forked from it would then read as dead (multiprocessing reports exit code 255).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
from collections.abc import Sequence

import torch.multiprocessing as tmp

from rlstruct.parallel.startup import forget_safe_path, starting_children

__all__ = ["worker_context", "FORKSERVER_MAX_FDS"]

#: The forkserver hands at most 256 descriptors to a new process (multiprocessing's limit);
#: a buffer with more shared tensors starts its workers with ``spawn`` instead.
FORKSERVER_MAX_FDS = 240



def _in_forkserver() -> bool:
    """This module is being imported by the forkserver's preload (multiprocessing's
    ``forkserver.main`` is on the stack)."""
    frame = sys._getframe()
    suffix = os.path.join("multiprocessing", "forkserver.py")
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_code.co_filename.endswith(suffix):
            return True
        frame = frame.f_back
    return False


if _in_forkserver():
    # Workers set their own SIGTERM handler, learner ranks ignore it as well.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    forget_safe_path()  # the workers' own children see the environment the user gave


def worker_context(
    start: bool = False, preload: Sequence[str] = ()
) -> multiprocessing.context.BaseContext:
    """The multiprocessing context workers start from: a forkserver with torch, this module and
    ``preload`` imported where the platform has one (Linux, macOS), ``spawn`` elsewhere.

    Args:
        start: start the forkserver now if it is not running (it imports its preload list in
            the background while the caller goes on; the first worker start waits for it).
        preload: the modules the workers run, imported once by the forkserver so that workers
            forked from it start without importing them (the caller names them: this module
            sits below every one of them). The list of the call that starts the forkserver is
            the one it keeps.
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = tmp.get_context("forkserver")
        ctx.set_forkserver_preload([__name__, *preload])
        if start:  # SIGINT ignored from its first line, the working directory not on its path
            with starting_children():
                multiprocessing.forkserver.ensure_running()
        return ctx
    return tmp.get_context("spawn")

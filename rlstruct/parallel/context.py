"""The multiprocessing context every rlstruct process starts from: batcher workers and learner
ranks alike.

Processes are forked from a forkserver process that has torch and rlstruct imported already
(multiprocessing's ``forkserver`` start method with a preload list): the first Batcher of a
program pays for those imports once, later ones start in a fraction of a second. The forkserver
is a fresh single-threaded process, so no CUDA context or thread of the caller is ever forked.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver

import torch.multiprocessing as tmp

__all__ = ["worker_context", "FORKSERVER_MAX_FDS", "PRELOAD"]

#: The forkserver hands at most 256 descriptors to a new process (multiprocessing's limit);
#: a buffer with more shared tensors starts its workers with ``spawn`` instead.
FORKSERVER_MAX_FDS = 240

#: Modules the forkserver imports once, so that workers forked from it start without importing.
PRELOAD = ["rlstruct.batchers.process.worker", "rlstruct.envs"]


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

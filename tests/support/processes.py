"""The processes a test leaves behind: every descendant except the long-lived helpers.

multiprocessing keeps two helper processes per program on purpose: the resource tracker and the
forkserver (the Batcher forks its workers from it). Everything else a test started must be gone
when it ends.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

import psutil


def _forkserver_pid() -> int | None:
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def children() -> list[psutil.Process]:
    """Descendants of this process, except multiprocessing's resource tracker and forkserver."""
    keep = {_forkserver_pid()}
    out = []
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if child.pid in keep or "resource_tracker" in " ".join(child.cmdline()):
                continue
            out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


def _is_ray(proc: psutil.Process) -> bool:
    try:
        cmd = " ".join(proc.cmdline())
        return cmd.startswith("ray::") or "/ray/" in cmd or proc.name() in ("raylet", "gcs_server")
    except psutil.Error:
        return True  # gone


def _parents(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.parents()
    except psutil.Error:
        return []


def non_ray_children() -> list[psutil.Process]:
    """:func:`children` but Ray's daemons and workers and their descendants (a loopback
    cluster's fixture owns them for a whole module)."""
    return [p for p in children() if not _is_ray(p) and not any(map(_is_ray, _parents(p)))]


def reap_non_ray_children(also: Callable[[], list] = list, seconds: float = 5.0) -> list:
    """Waits up to ``seconds`` for :func:`non_ray_children` (and ``also()``, e.g. actors still
    alive) to be empty; kills and fails on the processes left; returns ``also()``'s last value
    for the caller to check."""
    deadline = time.monotonic() + seconds
    while True:
        left, others = non_ray_children(), also()
        if (not left and not others) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert not left, f"the test left processes behind (now killed): {[p.pid for p in left]}"
    return others

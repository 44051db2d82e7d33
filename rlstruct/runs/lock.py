"""One session per run folder, and a resume that never damages the run it refuses.

:class:`FolderLock` holds an exclusive ``flock`` on ``RUN/.lock`` for as long as a session
writes the folder (a fresh run from its creation, a resumed one before it touches anything). A
second session on the same folder is refused with a :class:`~rlstruct.errors.ConfigError` that
names the holder (pid, host, start time). The kernel drops the lock when its process dies, so a
lock left by a killed session never blocks: the file stays, the lock does not.

:class:`FolderSnapshot` keeps the bytes of the files at the top of a run folder (``config.json``,
``progress.csv``, ``episodes.csv``, ``summary.json``, the plots); a resume that fails before it
has written anything of its own (a checkpoint state that does not load, a batcher that cannot
start) puts them back, so the folder is byte for byte what it was.

Example:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> with FolderLock(folder):
    ...     try:
    ...         FolderLock(folder)
    ...     except ConfigError as err:
    ...         print("refused:", "is in use by pid" in str(err))
    refused: True
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from rlstruct.errors import (
    ConfigError,
    LearnerError,
    LearnerTimeoutError,
    RLStructError,
    WorkerError,
)

__all__ = ["FolderLock", "FolderSnapshot", "FolderGuard", "LOCK_NAME", "removes_folder"]

#: The lock file's name inside a run folder.
LOCK_NAME = ".lock"


class FolderLock:
    """An exclusive lock on a run folder (see the module notes); a context manager.

    Args:
        folder: the run folder (it must exist).

    Raises:
        ConfigError: another live session holds the folder (named in the message).
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.path = Path(folder) / LOCK_NAME
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(self._fd, 512).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            self._fd = None
            raise ConfigError(f"{Path(folder)} is in use by {holder}: one session per run "
                              "folder (wait for it to end, or stop it)") from None
        started = datetime.datetime.now().isoformat(timespec="seconds")
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"pid {os.getpid()} on {socket.gethostname()} since {started}".encode())

    def release(self) -> None:
        """Unlocks and removes the lock file (idempotent)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self._fd)  # closing drops the flock
        self._fd = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class FolderSnapshot:
    """The top-level files of a run folder, to put back (see the module notes).

    Args:
        folder: the run folder.
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.files = {p.name: p.read_bytes() for p in self.folder.iterdir()
                      if p.is_file() and p.name != LOCK_NAME}

    def restore(self) -> None:
        """Writes every file back as it was and removes the top-level files made since."""
        for path in self.folder.iterdir():
            if path.is_file() and path.name not in self.files and path.name != LOCK_NAME:
                path.unlink()
        for name, data in self.files.items():
            path = self.folder / name
            if not path.is_file() or path.read_bytes() != data:
                path.write_bytes(data)


class FolderGuard:
    """A run's hold on its folder: the lock, and what a run that fails before its first
    iteration leaves behind. A resumed folder is put back byte for byte; a fresh folder whose
    run was refused by a typed error (a :class:`~rlstruct.errors.RLStructError`: a mistake of
    the user's, such as a Ray cluster that cannot be joined, a layout the algorithm cannot run,
    an env or agent that fails in the first segment) is removed, since it holds nothing but
    what the start wrote: a mistake leaves no folder (:func:`removes_folder`). A worker or
    learner process that failed (a :class:`~rlstruct.errors.WorkerError`, a hang included, or
    a :class:`~rlstruct.errors.LearnerError`) and an untyped error (a bug) keep the folder and
    its ``summary.json``: the record a Slurm job or a sweep reads.

    Args:
        resume: the folder being resumed (locked and snapshot now), or None for a fresh run
            (:meth:`adopt` its folder once it exists).

    Raises:
        ConfigError: the resumed folder is held by another session.
    """

    def __init__(self, resume: str | os.PathLike | None) -> None:
        self.folder = None if resume is None else Path(resume)
        self.lock = None if resume is None else FolderLock(resume)
        self.snapshot = None if resume is None else FolderSnapshot(resume)

    def adopt(self, folder: str | os.PathLike) -> None:
        """Locks the folder a fresh run just created (nothing to do on a resume)."""
        if self.lock is None:
            self.folder, self.lock = Path(folder), FolderLock(folder)

    def close(self, failed_early: bool = False, user_error: bool = False) -> None:
        """Releases the folder; ``failed_early``: the run failed before its first iteration
        (``user_error``: with a typed error), see the class notes."""
        if failed_early and self.snapshot is not None:
            self.snapshot.restore()  # a refused resume leaves the run as it was
        if self.lock is not None:
            self.lock.release()
        if failed_early and user_error and self.snapshot is None and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            with contextlib.suppress(OSError):  # the runs folder too, if that leaves it empty
                self.folder.parent.rmdir()


def removes_folder(exc: BaseException | None) -> bool:
    """Whether a fresh run that ``exc`` ended before its first iteration leaves no folder (see
    :class:`FolderGuard`): a typed error, but not a failed worker or learner process."""
    return isinstance(exc, RLStructError) and not isinstance(
        exc, (WorkerError, LearnerError, LearnerTimeoutError))

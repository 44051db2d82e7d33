"""How the processes of an rlstruct command start: stops are graceful from the first line the
command runs, and no process imports rlstruct from the working directory by accident.

- **Signals before a run's handlers exist.** The command line (the ``rlstruct`` console script,
  ``python -m rlstruct``, ``python -m rlstruct.algos.NAME``) imports the package first, and
  its first line calls :func:`install_if_command`: from then on SIGTERM and Ctrl-C (SIGINT)
  stop the command with one line on stderr and no traceback, exit code :data:`EXIT_CODES`
  (0 after SIGTERM, 130 after Ctrl-C). While the command imports its modules nothing has
  started, so the process ends at once; inside :func:`catching` (the command's parsing, the
  config check, a resume's checkpoint load, the run itself) the signal raises
  :class:`Terminated` instead, which the command line turns into the same line. A run then
  installs its own handlers (:class:`rlstruct.runs.signals.StopSignals`) and puts these back
  when it ends. A program that only imports rlstruct keeps its own handlers.
- **Children ignore Ctrl-C from birth.** The forkserver, and every worker and learner rank
  forked from it (and a worker started with ``spawn``), is started inside
  :func:`starting_children`: SIGINT is blocked in the starting thread, and a child inherits
  the blocked mask across ``exec``, so a Ctrl-C to the terminal's process group while the
  forkserver imports torch reaches the driver only (multiprocessing ignores SIGINT in the
  forkserver only after those imports). The driver loses nothing: its other threads take the
  signal, or it waits until the block ends. Workers and ranks then ignore SIGINT and unblock
  it (:func:`ignore_ctrl_c`), so that the processes they start get the usual mask.
- **No import from the working directory.** ``python -c`` (how multiprocessing starts the
  forkserver) puts the working directory first on ``sys.path``, and a folder named
  ``rlstruct`` there (a clone's parent, a ``$HOME`` holding ``~/rlstruct``) would then be
  imported as an empty namespace package in place of the installed one. The forkserver is
  started with ``PYTHONSAFEPATH=1`` (Python 3.11+), which leaves the working directory out;
  an explicit ``PYTHONPATH`` is kept. The forkserver removes the variable again
  (:func:`forget_safe_path`), so that the processes the workers start see the environment the
  user gave.
- **Workers end with the driver.** A process forked from the forkserver holds the forkserver's
  "alive" pipe open, so the forkserver outlives a driver killed by SIGKILL for as long as one
  of its workers lives, and a worker's parent-death signal (its parent is the forkserver) never
  comes; a worker stuck in ``env.step`` would never read the EOF of its pipe either. Every
  worker and learner rank therefore runs :func:`watch_driver`: a thread that ends the process
  as soon as the driver is gone, whatever its main thread is doing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Terminated", "EXIT_CODES", "install_if_command", "install", "catching",
           "command_module", "starting_children", "forget_safe_path", "watch_driver",
           "ignore_ctrl_c"]

#: The command line's exit code after a graceful stop, by signal: SIGTERM is how Slurm and
#: schedulers ask a job to stop, so the job ends COMPLETED; Ctrl-C is the shell's convention.
EXIT_CODES = {signal.SIGTERM: 0, signal.SIGINT: 130}

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Set beside ``PYTHONSAFEPATH`` when rlstruct set it (and the forkserver removes both).
_SAFE_PATH_MARK = "RLSTRUCT_SET_PYTHONSAFEPATH"
_state = {"catching": 0, "installed": False}
#: The package's name (the command line's modules are it and its submodules).
_PACKAGE = __name__.split(".")[0]


class Terminated(KeyboardInterrupt):
    """The command was stopped by a signal (SIGTERM or Ctrl-C); a run stopped so ended with its
    last row, a final checkpoint and ``summary.json`` with status ``interrupted``.

    Attributes:
        signum: the signal's number.
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"signal {signal.Signals(signum).name}")


def command_module(orig_argv: list[str] | None = None) -> str | None:
    """The rlstruct command this process runs, from its command line: the module of
    ``python -m rlstruct...``, ``"rlstruct"`` for the console script, else None (a program
    that imports rlstruct, the forkserver's ``python -c``)."""
    argv = list(getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv)
    words = iter(argv[1:])
    for word in words:
        if word in ("-W", "-X"):
            next(words, None)  # the option's argument
        elif word == "-m" or (word.startswith("-m") and len(word) > 2):
            module = word[2:] or next(words, "")
            return module if module.split(".")[0] == _PACKAGE else None
        elif word == "-c" or word == "-" or not word.startswith("-"):
            script = os.path.basename(word) if word not in ("-c", "-") else ""
            return _PACKAGE if script in (_PACKAGE, f"{_PACKAGE}-script.py") else None
    return None


def install_if_command() -> None:
    """Installs the start-up handlers (:func:`install`) when this process is an rlstruct
    command (:func:`command_module`); called by the package's first line."""
    if command_module() is not None:
        install()


def install() -> None:
    """SIGTERM and SIGINT stop this process gracefully (see the module notes); main thread
    only, elsewhere nothing is done."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _SIGNALS:
        signal.signal(sig, _handle)
    _state["installed"] = True


@contextlib.contextmanager
def catching() -> Iterator[None]:
    """A block in which a start-up handler raises :class:`Terminated` (the caller turns it into
    one line and its exit code) rather than ending the process at once."""
    _state["catching"] += 1
    try:
        yield
    finally:
        _state["catching"] -= 1


def _handle(signum: int, frame: Any) -> None:
    if _state["catching"]:
        raise Terminated(signum)
    code = EXIT_CODES.get(signum, 128 + signum)
    with contextlib.suppress(Exception):  # a closed stream: exit all the same
        sys.stdout.flush()
        print(f"rlstruct: stopped by {signal.Signals(signum).name} while starting (exit code "
              f"{code})", file=sys.stderr, flush=True)
    os._exit(code)  # nothing has started: no file, no process to close


@contextlib.contextmanager
def starting_children() -> Iterator[None]:
    """A block that starts the forkserver or a worker: SIGINT blocked in this thread (delivered
    after the block, or to another thread) and, inherited, in the child from its first
    instruction; the child does not put the working directory on ``sys.path``
    (``PYTHONSAFEPATH``)."""
    from multiprocessing import resource_tracker

    # first: starting the resource tracker unblocks SIGINT in the thread that starts it
    resource_tracker.ensure_running()
    mark = "PYTHONSAFEPATH" not in os.environ
    if mark:
        os.environ["PYTHONSAFEPATH"] = os.environ[_SAFE_PATH_MARK] = "1"
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if mark:
            os.environ.pop("PYTHONSAFEPATH", None)
            os.environ.pop(_SAFE_PATH_MARK, None)


def ignore_ctrl_c() -> None:
    """SIGINT ignored, and no longer blocked (:func:`starting_children`), in a worker or a
    learner rank: Ctrl-C to the process group is the driver's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def forget_safe_path() -> None:
    """Removes the ``PYTHONSAFEPATH`` that :func:`starting_children` set from this process's
    environment (the forkserver calls it, before it forks anything)."""
    if os.environ.pop(_SAFE_PATH_MARK, None) is not None:
        os.environ.pop("PYTHONSAFEPATH", None)


def watch_driver() -> None:
    """Ends this process (exit code 1, at once) when the process that started it through
    multiprocessing (the driver, also for a forkserver's child) is gone: a daemon thread waits
    on the driver's sentinel, which becomes readable when the driver's end of it closes, that
    is when the driver dies. Nothing is done outside a multiprocessing child."""
    import multiprocessing
    import multiprocessing.connection

    parent = multiprocessing.parent_process()
    sentinel = getattr(parent, "sentinel", None)
    if sentinel is None:
        return

    def watch() -> None:
        with contextlib.suppress(OSError, ValueError):  # the sentinel closed: leave all the same
            multiprocessing.connection.wait([sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="rlstruct-driver-watch", daemon=True).start()

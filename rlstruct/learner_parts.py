"""Learning independent parts of a model at once, one thread each: :func:`in_threads`.

An actor-critic with separate actor and critic networks (``rlstruct.nets.MLPActorCritic``) has
two independent learning problems per batch: the policy terms move only the actor, the value
term only the critic. Each can take its own epochs of minibatch steps with its own optimizer,
and the two can run at once. On the CPU, the small steps of RL nets are mostly per-operation
overhead, and much of it runs without the GIL (the kernels, the autograd engine), so two threads
of one process overlap: on the CartPole MLPs, an APPO segment's epochs take about 20 % less wall
time with about 1.5 cores busy (``python benchmarks/learner_step.py``, "actor and critic epochs
of a segment"). A second torch *intra-op* thread does not help these nets (the ``appo_2t``
benchmark row); two *inter-op* threads do.

Example:
    >>> in_threads([lambda: 1 + 1, lambda: "critic"], names=["actor", "critic"])
    [2, 'critic']
    >>> try:
    ...     in_threads([lambda: {}["x"]], names=["actor"])
    ... except LearnerError as err:
    ...     print(err, "| cause:", repr(err.__cause__))
    the actor part of the learner raised KeyError: 'x' | cause: KeyError('x')
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from rlstruct.errors import LearnerError, LearnerTimeoutError

__all__ = ["in_threads"]


def in_threads(
    parts: Sequence[Callable[[], Any]],
    names: Sequence[str] | None = None,
    timeout: float = 600.0,
) -> list[Any]:
    """Runs ``parts`` at once: the first in the calling thread, each other in a thread of its
    own; returns their results in order once all have finished.

    The parts must not share anything they write (e.g. the actor's and the critic's
    parameters and optimizers); reading shared tensors is fine. One part runs them in turn in
    the calling thread, with no thread started.

    Args:
        parts: functions of no argument.
        names: a name for each part, for errors (default ``part 0``, ``part 1``...).
        timeout: seconds to wait for the other threads after the caller's part is done.

    Returns:
        The results of ``parts``, in their order.

    Raises:
        LearnerError: a part raised (the first in order; ``from`` its exception, with its
            traceback in ``learner_traceback``). The others are still waited for.
        LearnerTimeoutError: a thread had not finished within ``timeout`` (it is a daemon
            thread and is left to finish on its own).
    """
    names = list(names) if names is not None else [f"part {i}" for i in range(len(parts))]
    if len(names) != len(parts):
        raise ValueError(f"in_threads: {len(parts)} parts but {len(names)} names")
    results: list[Any] = [None] * len(parts)
    errors: list[tuple[BaseException, str] | None] = [None] * len(parts)

    def run(i: int) -> None:
        try:
            results[i] = parts[i]()
        except BaseException as err:  # re-raised in the caller below
            errors[i] = (err, traceback.format_exc())

    threads = [threading.Thread(target=run, args=(i,), name=f"rlstruct-{names[i]}", daemon=True)
               for i in range(1, len(parts))]
    for thread in threads:
        thread.start()
    if parts:
        run(0)
    deadline = time.monotonic() + timeout
    for i, thread in enumerate(threads, start=1):
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            raise LearnerTimeoutError(f"the {names[i]} part of the learner has not finished "
                                      f"within {timeout:g} s")
    for name, error in zip(names, errors):
        if error is not None:
            err, tb = error
            raise LearnerError(f"the {name} part of the learner raised {type(err).__name__}: "
                               f"{err}", exc_type=type(err).__name__,
                               learner_traceback=tb) from err
    return results

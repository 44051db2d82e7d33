"""The errors a :class:`~rlstruct.learners.group.LearnerGroup` raises when its ranks fail or hang,
naming the likely culprit: a rank that raised outside a collective or died (the ranks whose
collective then failed are its victims), or a rank busy outside an all-reduce (the others wait in
one for it)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rlstruct.errors import LearnerError, LearnerTimeoutError
from rlstruct.learners.rank import PHASES

__all__ = ["Failure", "culprit_error", "hung_error"]

#: What a rank's failure is recorded as: ``(rank, batch or None, exception type, message,
#: traceback, raised inside a collective, exit code or None)``; a death has an exit code and
#: empty texts.
Failure = tuple[int, int | None, str, str, str, bool, int | None]


def culprit_error(failures: Sequence[Failure], what: str) -> LearnerError:
    """The error naming the first culprit of ``failures`` (at least one), reported while
    ``what``: a rank that raised outside a collective, or died; a rank whose collective failed
    is most likely a victim of another rank, named after it.

    Args:
        failures: what the ranks reported, in order of arrival.
        what: what the driver waited for.

    Returns:
        The :class:`~rlstruct.errors.LearnerError` to raise.
    """
    failures = sorted(failures, key=lambda f: f[5])
    rank, batch, exc_type, text, tb, _, exitcode = failures[0]
    if exitcode is not None:
        cause = f"died with exit code {exitcode}" + (
            f" (signal {-exitcode})" if exitcode < 0 else "")
    else:
        cause = f"raised {exc_type}: {text}"
    others = ", ".join(f"rank {f[0]} " + (f"died ({f[6]})" if f[6] is not None else
                                           f"raised {f[2]}") for f in failures[1:])
    return LearnerError(
        f"learner group: rank {rank} {cause} while {what}" +
        (f" (batch {batch})" if batch is not None else "") +
        (f"; then {others}" if others else "") +
        ". The group is unusable: close() it",
        rank=rank, batch=batch, exc_type=exc_type or None, learner_traceback=tb or None,
        exitcode=exitcode,
    )


def hung_error(what: str, seconds: float, waiting: list[int],
               rows: list[list[float]]) -> LearnerTimeoutError:
    """The error naming the ranks that did not finish ``what`` within ``seconds``.

    Args:
        what: what the driver waited for.
        seconds: how long it waited.
        waiting: the ranks it still waited for (sorted in place: busy outside a collective
            first).
        rows: the status table, one ``[batch, phase, since, n_allreduce]`` row per rank.

    Returns:
        The :class:`~rlstruct.errors.LearnerTimeoutError` to raise.
    """
    now = time.time()
    # Busy outside a collective first: the others wait in an all-reduce for them.
    waiting.sort(key=lambda r: PHASES[int(rows[r][1])] == "all-reduce")
    described = "; ".join(
        f"rank {r}: {PHASES[int(rows[r][1])]} on batch {int(rows[r][0])} for "
        f"{now - rows[r][2]:.1f} s" if rows[r][2] else f"rank {r}: not started"
        for r in waiting
    )
    return LearnerTimeoutError(
        f"learner group: ranks {waiting} did not finish {what} within {seconds:g} s "
        f"({described}). A rank busy outside an all-reduce is the likely culprit (hung "
        "learn function or env); raise timeout= if learning is legitimately this slow",
        ranks=waiting,
    )

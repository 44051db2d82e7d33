"""Restarts within a budget: the policy, the fault records and the seeds of a replacement.

By default a batcher fails fast: the first worker fault raises. With a :class:`RestartPolicy`, a
worker whose process dies, or whose env or agent raises, is replaced by a fresh one with the same
index; the segment it was collecting is NOT retried (a segment that always crashes would exhaust
the budget): its rows are left out of that batch, and the fault is recorded in
``batcher.faults``. The replacement builds fresh envs whose seeds derive from the run seed and
the restart count (:func:`restart_env_seed`), loads the current weights, and collects from the
next segment on.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlstruct.errors import ConfigError, WorkerError

__all__ = ["RestartPolicy", "Fault", "restart_env_seed", "exhausted", "RESTART_SEED_STRIDE"]

#: Seeds of the r-th replacement are the original seeds plus ``r * RESTART_SEED_STRIDE``: far
#: from every run's block of env seeds, and the same modulo ``2**32`` (so anything that reads an
#: env's global index from its seed modulo the seed block still reads it).
RESTART_SEED_STRIDE = 1 << 32


@dataclass(frozen=True)
class RestartPolicy:
    """How many worker faults a batcher absorbs before it raises.

    Args:
        max_restarts: restarts allowed over the batcher's life (all workers together); the
            fault after the last one raises.
        delay_s: seconds to wait before starting a replacement (a crashing simulator may need
            a moment to release its resources).
        max_consecutive: faults allowed in a row without one complete batch in between; the
            next one raises even if ``max_restarts`` is not spent (a broken setup, not bad luck).

    Raises:
        ConfigError: negative numbers.
    """

    max_restarts: int = 3
    delay_s: float = 0.0
    max_consecutive: int | None = None

    def __post_init__(self) -> None:
        bad = []
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int):
            bad.append(f"max_restarts must be an int, got {self.max_restarts!r}")
        elif self.max_restarts < 0:
            bad.append(f"max_restarts must be >= 0, got {self.max_restarts}")
        if not self.delay_s >= 0:
            bad.append(f"delay_s must be >= 0, got {self.delay_s!r}")
        if self.max_consecutive is not None and (
            not isinstance(self.max_consecutive, int) or self.max_consecutive < 1
        ):
            bad.append(f"max_consecutive must be None or an int >= 1, got {self.max_consecutive!r}")
        if bad:
            raise ConfigError("invalid RestartPolicy: " + "; ".join(bad))


@dataclass(frozen=True)
class Fault:
    """One worker fault that a restart absorbed.

    Attributes:
        worker: the worker (process or actor) index.
        env: the global env index when known.
        step: the step of the segment when known.
        segment: the segment the fault spoiled (its rows were left out of that batch).
        exc_type: the exception's type name (None for a process that died).
        message: the first line of the error.
        exitcode: the exit code of a process that died.
        restart: the restart number this fault caused (1 for the first).
    """

    worker: int
    env: int | None
    step: int | None
    segment: int | None
    exc_type: str | None
    message: str
    exitcode: int | None
    restart: int


def restart_env_seed(env_seed: int, restart: int) -> int:
    """The env seed base of a worker's ``restart``-th replacement (0: the original).

    Examples:
        >>> restart_env_seed(2 * 2**20 + 8, 0) == 2 * 2**20 + 8
        True
        >>> restart_env_seed(8, 1) % 2**32
        8
    """
    return env_seed + restart * RESTART_SEED_STRIDE


def exhausted(
    policy: RestartPolicy, error: WorkerError, restarts: int, in_a_row: int
) -> WorkerError | None:
    """The error to raise instead of restarting, once ``policy``'s budget is spent (else None).

    Args:
        policy: the batcher's restart policy.
        error: the fault that would cost one more restart.
        restarts: restarts so far (all workers).
        in_a_row: faults since the last complete batch.

    Returns:
        ``error`` with a message saying how many restarts happened and why no more are allowed
        (the last cause; the earlier ones are in ``batcher.faults``), or None to restart.
    """
    spent = restarts >= policy.max_restarts
    too_many = policy.max_consecutive is not None and in_a_row >= policy.max_consecutive
    if not (spent or too_many):
        return None
    why = (
        f"max_restarts={policy.max_restarts} spent"
        if spent
        else f"{in_a_row} faults in a row (max_consecutive={policy.max_consecutive})"
    )
    return WorkerError(
        f"{error.args[0]} [restart budget exhausted: {restarts} restart(s) so far, {why}; "
        "this is the last cause; earlier ones are in batcher.faults]",
        worker=error.worker,
        env=error.env,
        step=error.step,
        exc_type=error.exc_type,
        remote_traceback=error.remote_traceback,
        exitcode=error.exitcode,
    )

"""The typed errors of rlstruct.

Every error a user can cause derives from :class:`RLStructError` and, where natural, from the
matching builtin too (``ShapeError`` is a ``ValueError``), so ``except ValueError`` keeps working.
Messages name the culprit (key, worker, env, device) and say what was expected; a missing
optional dependency says how to install its extra (:func:`install_hint`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "RLStructError",
    "ShapeError",
    "KeyMismatchError",
    "DeviceContractError",
    "SpaceError",
    "ActionError",
    "RewardError",
    "ObservationError",
    "ActionMaskError",
    "ConfigError",
    "AutoresetModeError",
    "NonFiniteError",
    "CheckpointError",
    "RunFolderError",
    "RunFileError",
    "BatcherStateError",
    "WorkerError",
    "WorkerTimeoutError",
    "LearnerError",
    "LearnerTimeoutError",
    "install_hint",
]


class RLStructError(Exception):
    """Base class of every error rlstruct raises on purpose."""


class ShapeError(RLStructError, ValueError):
    """A tensor has the wrong batch size, time length or shape."""


class KeyMismatchError(RLStructError, KeyError):
    """Keys are missing, unexpected or overlap (e.g. ``cat`` of DictTensors with other keys)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


class DeviceContractError(RLStructError, RuntimeError):
    """A tensor lives on another device than the contract says.

    Attributes:
        argument: which argument broke the contract (``state``, ``observation``, ...), if known.
        key: the offending key, if known.
        expected: the expected device.
        actual: the device found.
    """

    def __init__(
        self,
        message: str,
        *,
        argument: str | None = None,
        key: str | None = None,
        expected: object = None,
        actual: object = None,
    ) -> None:
        super().__init__(message)
        self.argument = argument
        self.key = key
        self.expected = expected
        self.actual = actual


class SpaceError(RLStructError, TypeError):
    """A gymnasium space that rlstruct cannot carry in tensors."""


class ActionError(RLStructError, ValueError):
    """An action outside its action space (caught before the env sees it)."""


class RewardError(RLStructError, TypeError):
    """An env returned a reward that is not a real scalar number (``None``, a ``str``, an array
    of several values, a complex number); rlstruct refuses it instead of casting it.

    Attributes:
        env_index: the LOCAL index of the env in its VecEnv (batchers report the global one).
    """


class ObservationError(RLStructError, ValueError):
    """An env returned a float observation holding NaN or an infinity (at a step or in a reset
    observation); the VecEnv refuses it before any agent acts on it.

    The message names the env by its GLOBAL index, the observation key and the ``env_step``
    (``env 5: observation key 'frame' holds nan at env_step 3 ...``); through a ``Batcher`` the
    :class:`WorkerError` that carries it adds the worker and the segment's step.

    Attributes:
        env_index: the LOCAL index of the env in its VecEnv (batchers report the global one).
        env: the GLOBAL index of the env (over every worker of a batcher).
        key: the observation key (``"frame"``, or a Dict/Tuple leaf's key such as ``"pos"``).
        env_step: the env's ``env_step`` (0 for a reset observation).
        value: the first non-finite value found (``nan``, ``inf`` or ``-inf``).
        worker: the worker (``Batcher``) or ``0`` (``SerialBatcher``) whose loop stepped the
            env; None outside a batcher.
        step: the time step within the segment; None outside a batcher.
    """

    def __init__(
        self,
        message: str,
        *,
        env_index: int,
        env: int,
        key: str,
        env_step: int,
        value: float,
    ) -> None:
        super().__init__(message)
        self.env_index = env_index
        self.env = env
        self.key = key
        self.env_step = env_step
        self.value = value
        self.worker: int | None = None
        self.step: int | None = None

    def __reduce__(self) -> tuple[Any, ...]:  # picklable despite keyword-only arguments
        return (_observation_error, (self.args, self.__dict__))


def _observation_error(args: tuple[Any, ...], state: dict[str, Any]) -> ObservationError:
    err = ObservationError.__new__(ObservationError, *args)
    err.args = args
    err.__dict__.update(state)
    return err


class ActionMaskError(RLStructError, ValueError):
    """An env's action mask (``info["action_mask"]`` or an ``action_mask`` observation leaf)
    allows no action, or does not have one entry per action, in an observation an agent would
    act on. The message names the env by its GLOBAL index and the ``env_step``; ``env_index``
    is its LOCAL index.
    """


class ConfigError(RLStructError, ValueError):
    """A bad configuration (sizes, seeds, devices, factories), raised before anything starts."""


class AutoresetModeError(ConfigError):
    """A gymnasium vector env whose auto-reset mode cannot be told apart (no
    ``metadata["autoreset_mode"]``, or a value that is not one of gymnasium's
    ``AutoresetMode``); raised when the VecEnv adapting it is built, before any step.

    Attributes:
        mode: the value found (None where the metadata has none).
    """

    def __init__(self, message: str, *, mode: Any = None) -> None:
        super().__init__(message)
        self.mode = mode


class NonFiniteError(RLStructError, ValueError):
    """A tensor that must be finite holds NaN or an infinity (e.g. weights handed to a batcher's
    ``update``); the message names its key."""


class CheckpointError(RLStructError, OSError):
    """A checkpoint could not be written or read (disk full, permissions, a missing file); the
    message names the file and the cause, and a failed write keeps the last good checkpoint."""


class RunFolderError(RLStructError, FileNotFoundError):
    """A run's folder was removed (or moved) while the run was going on: the run stops, as it
    cannot write its progress, checkpoints or summary; the message names the folder."""


class RunFileError(RLStructError, OSError):
    """A file of a run folder cannot be read or written (a ``progress.csv`` that is not UTF-8,
    a plot into a read-only folder); the message names the file and the cause."""


class BatcherStateError(RLStructError, RuntimeError):
    """A batcher method was called out of order (e.g. ``execute`` twice without ``get``)."""


class WorkerError(RLStructError, RuntimeError):
    """Something failed inside a batcher worker (or the worker died).

    Attributes:
        worker: index of the worker process.
        env: global index of the env being stepped, if known.
        step: time step within the segment, if known.
        exc_type: the name of the original exception type, if any.
        remote_traceback: the traceback formatted in the worker, if any.
        exitcode: the worker's exit code if it died.
    """

    def __init__(
        self,
        message: str,
        *,
        worker: int | None = None,
        env: int | None = None,
        step: int | None = None,
        exc_type: str | None = None,
        remote_traceback: str | None = None,
        exitcode: int | None = None,
    ) -> None:
        super().__init__(message)
        self.worker = worker
        self.env = env
        self.step = step
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback
        self.exitcode = exitcode

    def __str__(self) -> str:
        text = str(self.args[0]) if self.args else ""
        if self.remote_traceback:
            text += "\n\nRemote traceback:\n" + self.remote_traceback.rstrip()
        return text


class WorkerTimeoutError(WorkerError, TimeoutError):
    """A worker stayed silent for longer than the batcher's timeout (hung env or agent)."""


class LearnerError(RLStructError, RuntimeError):
    """``learn`` raised in the learner thread (or the thread is gone), or a rank of a
    :class:`~rlstruct.learners.group.LearnerGroup` raised or died.

    Raised ``from`` the original exception: ``err.__cause__`` is it, with its traceback from the
    learner thread (which keeps the frames of ``learn``, and so the batch, alive while referenced).

    Attributes:
        batch: index of the batch ``learn`` failed on, counting from 0 in put order, if known.
        exc_type: the name of the original exception type, if any.
        learner_traceback: the original traceback, formatted in the learner thread (or rank),
            if any.
        rank: the learner group's rank that failed first, if any.
        exitcode: that rank's exit code if it died.
    """

    def __init__(
        self,
        message: str,
        *,
        batch: int | None = None,
        exc_type: str | None = None,
        learner_traceback: str | None = None,
        rank: int | None = None,
        exitcode: int | None = None,
    ) -> None:
        super().__init__(message)
        self.batch = batch
        self.exc_type = exc_type
        self.learner_traceback = learner_traceback
        self.rank = rank
        self.exitcode = exitcode

    def __str__(self) -> str:
        text = str(self.args[0]) if self.args else ""
        if self.rank is not None and self.learner_traceback:
            text += f"\n\nTraceback in rank {self.rank}:\n" + self.learner_traceback.rstrip()
        return text


class LearnerTimeoutError(RLStructError, TimeoutError):
    """``put`` found no free queue slot before its deadline, ``wait_idle`` ran out of time, or
    ``stop`` could not join a thread still inside ``learn``; or ranks of a learner group did not
    answer before their deadline.

    Attributes:
        ranks: the learner group's ranks that did not answer (the likely culprits first), if any.
    """

    def __init__(self, message: str, *, ranks: list[int] | None = None) -> None:
        super().__init__(message)
        self.ranks = ranks


def install_hint(extra: str) -> str:
    """How to install an optional extra of rlstruct, for the message of a missing dependency.

    rlstruct is not on a package index: an extra is installed from a clone of the repository
    (editable), or with the wheel built from one (as ``.ci/wheel-check`` builds it).

    Args:
        extra: the extra's name in ``pyproject.toml`` (``"ray"``, ``"atari"``).

    Example:
        >>> install_hint("ray").split(" (")[0]
        "pip install -e '.[ray]' in a clone of rlstruct"
    """
    return (f"pip install -e '.[{extra}]' in a clone of rlstruct "
            f"(a wheel: pip install 'PATH/rlstruct-VERSION-py3-none-any.whl[{extra}]')")

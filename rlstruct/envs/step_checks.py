"""The checks of a CPU VecEnv's step: the call and the actions before any env is stepped, the
envs' answers after, each error naming its env.

:func:`check_step` starts every CPU VecEnv's ``step`` (:class:`~rlstruct.envs.GymEnv`,
:class:`~rlstruct.envs.GymEnvInf`, :class:`~rlstruct.envs.EnvPoolEnv`); :func:`check_running`
and :func:`action_rows` are the parts it shares with the torch-native envs. An
:class:`AnswerChecker` checks what gymnasium envs return: five values per ``step``, observation
frames exactly in their space's dtype (numpy would promote silently), and rewards that are real
scalar numbers (the rules are in :mod:`rlstruct.envs.gym`). :func:`check_observations` refuses
float observations holding NaN or an infinity (``check_obs``, GymEnv's and EnvPoolEnv's) and
:func:`observation_error` builds the :class:`~rlstruct.errors.ObservationError` every VecEnv
raises for them. Errors about one env carry ``exc.env_index``, its LOCAL index; messages name it
by its global index (``offset + k``).
"""

from __future__ import annotations

import contextlib
import numbers
import warnings
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.envs.spaces import ActionSpec, Leaf, check_leaf, short_repr
from rlstruct.errors import (
    BatcherStateError,
    ConfigError,
    DeviceContractError,
    ObservationError,
    RewardError,
    RLStructError,
    ShapeError,
)

__all__ = [
    "name_failed_env",
    "write_info",
    "check_finite_rewards",
    "check_step",
    "check_running",
    "action_rows",
    "AnswerChecker",
    "check_observations",
    "observation_error",
]

_CPU = torch.device("cpu")
_DTYPE = attrgetter("dtype")
_REAL_KINDS = "biuf"  # numpy dtype kinds a reward may have: bool, int, uint, float
_F32_MAX = float(np.finfo(np.float32).max)


def check_running(name: str, run: np.ndarray | Tensor | None, failed: str = "") -> None:
    """Refuses a ``step`` before ``reset`` and a ``step`` with no env running.

    Args:
        name: the VecEnv's class name (named in the messages).
        run: its running env indices, ``None`` before reset.
        failed: added after "before reset()" where a failed step also leaves ``run`` None.

    Raises:
        BatcherStateError: ``run`` is None or empty.
    """
    if run is None:
        raise BatcherStateError(f"{name}.step called before reset(){failed}; call reset() first")
    if run.shape[0] == 0:
        raise BatcherStateError(
            f"{name}.step called with no running env: every episode has ended; call reset() "
            "to start new ones"
        )


def action_rows(action: DictTensor, n: int) -> Tensor:
    """The ``action`` tensor of a ``step`` argument, checked to hold one row per running env.

    Args:
        action: the ``step`` argument.
        n: the number of running envs.

    Returns:
        ``action["action"]``, ``(n, *action_shape)``, as given.

    Raises:
        TypeError: ``action`` is not a DictTensor.
        ShapeError: not ``n`` rows.
    """
    if not isinstance(action, DictTensor):
        raise TypeError(f"step takes a DictTensor, got {type(action).__name__}")
    a = action[K.ACTION_KEY]
    if a.shape[0] != n:
        raise ShapeError(
            f"action has {a.shape[0]} rows, expected {n} (one per running env, in the order "
            "of `running`)"
        )
    return a


def check_step(
    env: VecEnv, run: np.ndarray | None, action: DictTensor, act: ActionSpec, offset: int
) -> tuple[np.ndarray, np.ndarray]:
    """The checks every CPU VecEnv's ``step`` starts with (before any env is stepped).

    Args:
        env: the VecEnv (named in the messages).
        run: its running env indices, ``None`` before reset or after a failed step.
        action: the ``step`` argument.
        act: the action space's checker.
        offset: the global index of env 0 (error messages).

    Returns:
        ``(running, actions as numpy)``.

    Raises:
        BatcherStateError: no reset yet, a failed step, or no env running.
        TypeError: ``action`` is not a DictTensor.
        ShapeError: not one action row per running env.
        DeviceContractError: the action is not on the CPU.
        ActionError: an action outside the action space.
    """
    name = type(env).__name__
    check_running(name, run, " (or after a failed step)")
    a = action_rows(action, run.shape[0])
    if not a.is_cpu:
        raise DeviceContractError(
            f"{name} steps CPU envs, but the action is on {a.device}; wrap the VecEnv with "
            "DeviceEnv(env, 'cpu', device) to move actions back",
            argument="action",
            key=K.ACTION_KEY,
            expected=_CPU,
            actual=a.device,
        )
    return run, act.to_numpy(a, run, offset)


def observation_error(
    key: str, k: int, offset: int, env_step: int, value: float, reset: bool = False
) -> ObservationError:
    """The :class:`ObservationError` of env ``k`` (LOCAL index) whose observation key ``key``
    holds the non-finite ``value``; its message names the env by its global index
    ``offset + k``.

    Args:
        key: the observation key.
        k: the env's local index (``exc.env_index``).
        offset: the global index of env 0.
        env_step: the env's ``env_step`` (0 for a reset observation).
        value: the first non-finite value of the observation.
        reset: the observation is a reset observation (the first of an episode).
    """
    when = "in its reset observation" if reset else f"at env_step {env_step}"
    return ObservationError(
        f"env {offset + k}: observation key {key!r} holds {value} {when}; rlstruct refuses NaN "
        "and infinite observations before the agent acts on them (fix the env, or pass "
        "check_obs=False to the VecEnv to let them through); call reset() to go on",
        env_index=k,
        env=offset + k,
        key=key,
        env_step=0 if reset else env_step,
        value=value,
    )


def check_observations(
    arrays: Sequence[np.ndarray],
    keys: Sequence[tuple[int, str]],
    rows: np.ndarray,
    offset: int,
    env_step: np.ndarray,
    reset: bool = False,
) -> None:
    """Raises :class:`ObservationError` for the first float observation holding NaN or an
    infinity. The common path is one ``np.isfinite(x).all()`` per float key (about 1.5 us for
    32 CartPole rows); the culprit row is looked for only when it fails.

    Args:
        arrays: the observation leaves' arrays, row ``j`` = env ``rows[j]``.
        keys: ``(index in arrays, key)`` of the float leaves to check.
        rows: the LOCAL env index of each row.
        offset: the global index of env 0 (messages).
        env_step: the VecEnv's ``env_step`` per env (indexed by local env index).
        reset: the arrays are reset observations.

    Raises:
        ObservationError: naming the env (global index), key and env_step.
    """
    for i, key in keys:
        x = arrays[i]
        if np.isfinite(x).all():
            continue
        bad = ~np.isfinite(x.reshape(x.shape[0], -1))
        j = int(np.flatnonzero(bad.any(axis=1))[0])
        k = int(rows[j])
        value = float(x.reshape(x.shape[0], -1)[j][bad[j]][0])
        raise observation_error(key, k, offset, int(env_step[k]), value, reset)


class AnswerChecker:
    """Checks the answers of the gymnasium envs of one VecEnv, naming the culprit env.

    Args:
        frame: the observation leaf when the observation is one array (the fast path), else None.
        offset: the global index of env 0 (messages).
        env_step: the VecEnv's ``env_step`` array ``(N,)`` (read at each error, never copied).
        check_finite: a finite reward that overflows float32 raises instead of warning.

    Attributes:
        offset: the global index of env 0; the VecEnv updates it when a batcher tells it.
    """

    def __init__(
        self, frame: Leaf | None, offset: int, env_step: np.ndarray, check_finite: bool
    ) -> None:
        self._leaf = frame
        self._frame_dtypes = {frame.dtype} if frame is not None else set()
        self.offset = offset
        self._t = env_step
        self._check_finite = check_finite

    def frame(self, obs: Sequence[Any], run: np.ndarray) -> np.ndarray:
        """The observations of the rows as one array, exactly in the leaf's dtype (no cast).

        Fast path: one ``np.asarray`` plus one C-level pass over the values' dtypes (numpy
        promotes silently: an int16 row among float32 rows, or a float32 row among float64
        rows, would otherwise be cast). Otherwise each row is checked and the first bad one
        raises, with ``env_index`` set to ITS env (not the last env stepped).
        """
        lf = self._leaf
        try:
            frame = np.asarray(obs)
        except (ValueError, TypeError):  # ragged shapes: find the culprit below
            frame = None
        if frame is not None and frame.dtype == lf.dtype and frame.shape[1:] == lf.shape:
            if lf.scalar_int:  # Python ints of a Discrete leaf are exact
                exact = True
            else:
                try:
                    exact = set(map(_DTYPE, obs)) == self._frame_dtypes
                except AttributeError:  # a list or a Python number: check_leaf refuses it
                    exact = False
            if exact:
                if frame.base is not None or not frame.flags.writeable:
                    frame = frame.copy()
                return frame
        for k, v in zip(run.tolist(), obs):
            if v.__class__ is not np.ndarray or v.dtype != lf.dtype or v.shape != lf.shape:
                try:
                    check_leaf(v, lf, self.offset + k)  # raises unless exact (e.g. int)
                except RLStructError as e:
                    e.env_index = k  # type: ignore[attr-defined]
                    raise
        return np.asarray(obs).astype(lf.dtype)

    def answers(self, answers: Sequence[Any], run: np.ndarray) -> None:
        """Raises naming the first env whose ``step`` did not return 5 values."""
        for k, answer in zip(run.tolist(), answers):
            try:
                n = len(answer)
            except TypeError:
                n = None
            if n != 5:
                got = f"{n} values" if n is not None else f"a {type(answer).__name__}"
                err = ValueError(
                    f"env {self.offset + k}: step() returned {got}, expected the 5 values of "
                    "gymnasium's API (obs, reward, terminated, truncated, info)"
                )
                err.env_index = k  # type: ignore[attr-defined]
                raise err

    def rewards(self, rew: Sequence[Any], run: np.ndarray) -> np.ndarray:
        """The rewards of the rows as a fresh float32 array (see the module docstring).

        Fast path: one ``np.asarray`` whose dtype kind and shape say every reward is a real
        scalar, and one cast to float32 that raises on overflow instead of warning. The rewards
        are walked one by one only when that fails, to name the culprit.

        Raises:
            RewardError: a reward is not a real scalar number.
            FloatingPointError: a finite reward overflows float32 and ``check_finite`` is set.
        """
        try:
            r = np.asarray(rew)
        except Exception:  # noqa: BLE001 - ragged, or a value numpy cannot take: the walk names it
            r = None
        if r is None or r.dtype.kind not in _REAL_KINDS or r.shape != (run.shape[0],):
            r = self._walk_rewards(rew, run)
        if r.dtype.kind == "f" and r.dtype.itemsize > 4:
            # The usual case, no reward beyond float32's range (an infinity takes the careful
            # path, which keeps it), costs three cheap calls, without numpy's errstate.
            if not np.count_nonzero(np.abs(r) > _F32_MAX):  # (NaN passes: it casts quietly)
                return r.astype(np.float32)
            try:
                with np.errstate(over="raise"):
                    return r.astype(np.float32)
            except FloatingPointError:
                limit = np.finfo(np.float32).max
                for j in np.flatnonzero(np.isfinite(r) & (np.abs(r) > limit)).tolist():
                    self._reward_overflow(rew[j], int(run[j]))
                with np.errstate(over="ignore"):
                    return r.astype(np.float32)
        return r.astype(np.float32, copy=False)  # np.asarray built a fresh array

    def _walk_rewards(self, rew: Sequence[Any], run: np.ndarray) -> np.ndarray:
        """The slow path of :meth:`rewards`: float64 values, or RewardError for the first
        reward that is not a real scalar number."""
        out = np.empty(len(rew), np.float64)
        for j, (k, v) in enumerate(zip(run.tolist(), rew)):
            if isinstance(v, numbers.Real):  # Python and numpy numbers, bool, Fraction
                try:
                    out[j] = v
                except OverflowError:  # an int beyond float64: overflows float32 too
                    self._reward_overflow(v, k)
                    out[j] = np.inf if v > 0 else -np.inf
                continue
            try:
                a = np.asarray(v)
            except Exception:  # noqa: BLE001 - not an array: the checks below name the reward
                a = None
            if a is not None and a.shape == () and a.dtype.kind in _REAL_KINDS:
                out[j] = a  # a 0-d array (numpy's, or a CPU tensor's)
                continue
            if isinstance(v, np.ndarray):
                what = f"an ndarray of shape {v.shape} and dtype {v.dtype}"
            else:
                what = f"{short_repr(v)} ({type(v).__name__})"
            err = RewardError(
                f"env {self.offset + k}: its reward at env_step {int(self._t[k])} is {what}; a "
                "reward must be one real number (int, float, bool, a numpy real scalar or 0-d "
                "array) and rlstruct never casts it silently: fix the env or wrap it with a "
                "gymnasium.RewardWrapper; call reset() to go on"
            )
            err.env_index = k  # type: ignore[attr-defined]
            raise err
        return out

    def _reward_overflow(self, v: Any, k: int) -> None:
        """A finite reward ``v`` of env ``k`` overflows float32: raise or warn, naming env ``k``."""
        what = (
            f"env {self.offset + k}: the reward {short_repr(v)} at env_step {int(self._t[k])} "
            "overflows float32 (largest finite value 3.4e38)"
        )
        if self._check_finite:
            err = FloatingPointError(f"{what} (check_finite=True); call reset() to go on")
            err.env_index = k  # type: ignore[attr-defined]
            raise err
        warnings.warn(
            f"{what}; it is stored as inf. Scale the env's rewards (gymnasium.RewardWrapper), "
            "or pass check_finite=True to make this an error",
            RuntimeWarning,
            stacklevel=2,
        )


def write_info(info_keys: Sequence[str], info: Any, arrays: list[np.ndarray], j: int, k: int,
               offset: int) -> None:
    """Writes env ``k``'s ``info[name]`` (0.0 where missing) into row ``j`` of each array.

    Raises:
        ConfigError: a named entry is not a numeric scalar (naming the global env).
    """
    for name, arr in zip(info_keys, arrays):
        v = info.get(name, 0.0)
        try:
            arr[j] = v
        except (TypeError, ValueError):
            err = ConfigError(f"env {offset + k}: info[{name!r}] is {short_repr(v)} "
                              f"({type(v).__name__}); info_keys must name numeric scalar entries")
            err.env_index = k  # type: ignore[attr-defined]
            raise err from None


def check_finite_rewards(reward: np.ndarray, run: np.ndarray, env_step: np.ndarray,
                         offset: int) -> None:
    """``check_finite``: raises FloatingPointError naming the env of the first NaN or infinite
    reward (``reward[j]`` is env ``run[j]``'s)."""
    ok = np.isfinite(reward)
    if ok.all():
        return
    j = int(np.flatnonzero(~ok)[0])
    k = int(run[j])
    err = FloatingPointError(
        f"env {offset + k}: observation key {K.REWARD!r} holds {short_repr(reward[j])} at "
        f"env_step {int(env_step[k])} (check_finite=True); call reset() to go on")
    err.env_index = k  # type: ignore[attr-defined]
    raise err


def name_failed_env(e: BaseException, k: int, what: str, vecenv: str, offset: int,
                    env_step: np.ndarray) -> None:
    """Names the env of ``e``: the one a check already set in ``e.env_index``, else ``k`` (the
    env being stepped or reset; -1: none known); an error the env raised itself gets a note
    naming it (``what``: ``"step"`` or ``"reset"``; ``vecenv``: the VecEnv's class name)."""
    known_index = getattr(e, "env_index", None)
    if known_index is not None:
        k = int(known_index)
    elif k >= 0:
        with contextlib.suppress(AttributeError):  # exceptions with __slots__
            e.env_index = k  # type: ignore[attr-defined]
    if k < 0:
        return
    if not isinstance(e, RLStructError) and hasattr(e, "add_note"):  # Python >= 3.11
        # k is the VecEnv's own index; a batcher reports the global one (WorkerError.env).
        known = f", global id {offset + k}" if offset else ""
        e.add_note(f"raised while {vecenv} called {what}() of its env {k}{known} "
                   f"(env_step {int(env_step[k])}); call reset() to go on")

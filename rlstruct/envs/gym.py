"""``GymEnv`` (episodic) and ``GymEnvInf`` (auto-reset): ``N`` gymnasium envs as one VecEnv.

Both step their envs one after the other in the calling process (worker processes are the
batchers' business). This is the batchers' hot path, so a step costs, beyond the envs themselves:
one vectorised numpy check of all actions, one write by index per key and env into numpy staging
arrays allocated once at construction, and one copy plus ``torch.from_numpy`` per key. The copy
is what lets the returned tensors outlive the next step: nothing returned ever aliases a staging
array.

Observation keys and dtypes follow :mod:`rlstruct.envs.spaces`; every observation also holds
``reward`` (float32), ``terminated``, ``truncated``, ``done`` (bool), ``initial_state`` (bool, True
in a reset observation), ``last_action`` (the action's shape and dtype; the space's default at
reset), ``env_step`` (int64, 0 at reset) and, per name in ``info_keys``, ``info/<name>`` (float32,
0 where the env's ``info`` lacks it). Keys, shapes and dtypes are the same at reset and at step.

Seeding: env ``k`` of a VecEnv built with ``seed=s`` has its ``action_space`` seeded ``s + k`` and
gets ``reset(seed=s + k)`` on its FIRST reset only; later resets continue the env's own RNG, as
gymnasium recommends.

Rewards: each env's reward must be a real scalar number: a Python ``int``, ``float`` or ``bool``
(``True`` is 1.0), a numpy integer, float or bool scalar, a 0-d array of such a dtype, or any
other ``numbers.Real``. ``None``, a ``str`` (even ``"2.5"``), an array of several values and a
complex number raise :class:`RewardError` naming the env and its ``env_step``; nothing is cast
silently. Rewards are stored as float32: a finite reward too large for float32 (``1e40``) raises
``FloatingPointError`` with ``check_finite=True`` and otherwise is stored as ``inf`` with a
``RuntimeWarning`` naming the env (never numpy's anonymous overflow warning). The check is one
vectorised conversion per step; the rewards are walked one by one only when it fails.

Failures: an invalid action raises :class:`ActionError` before any env is stepped, and the VecEnv
stays usable. Any error raised once envs have been stepped (by an env, an observation that does
not match its space, or a bad reward) leaves the envs half-stepped: the next ``step`` asks for a
``reset``. Every error about one env (those, :class:`ActionError`, ``FloatingPointError``)
carries ``exc.env_index``, the LOCAL index of the env that produced it in this VecEnv (batchers add
their offset), its message names that env by its global index, and errors raised by the env
itself get a note naming it.
"""

from __future__ import annotations

import contextlib
import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import StepResult, VecEnv
from rlstruct.envs.spaces import (
    ActionSpec,
    Leaf,
    check_leaf,
    env_info_options,
    observation_leaves,
    short_repr,
    torch_dtype,
    write_leaves,
)
from rlstruct.errors import (
    BatcherStateError,
    ConfigError,
    DeviceContractError,
    RewardError,
    RLStructError,
    ShapeError,
    SpaceError,
)

__all__ = ["GymEnv", "GymEnvInf", "EnvFactory"]

#: A zero-argument callable that builds one gymnasium env (must be picklable for worker batchers).
EnvFactory = Callable[[], gym.Env]

_CPU = torch.device("cpu")
_INFO = "info/"
_DTYPE = attrgetter("dtype")
_REAL_KINDS = "biuf"  # numpy dtype kinds a reward may have: bool, int, uint, float


class _GymVecEnv(VecEnv):
    """What GymEnv and GymEnvInf share: envs, spaces, staging arrays, reset, checks."""

    def __init__(
        self,
        env: str | Sequence[EnvFactory],
        n_envs: int | None = None,
        seed: int = 0,
        *,
        make_kwargs: Mapping[str, Any] | None = None,
        env_info_keys: Sequence[str] | None = None,
        info_keys: Sequence[str] = (),
        env_id_offset: int = 0,
        check_finite: bool = False,
        obs_dtype: str | np.dtype | torch.dtype | None = None,
    ) -> None:
        # First: rlstructures' GymEnv(envs, seed) (env instances, the seed second) gets an error
        # saying what changed, whatever its other arguments hold.
        _refuse_env_instances(env, n_envs)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"seed must be an int >= 0, got {seed!r}")
        if not isinstance(env_id_offset, (int, np.integer)) or env_id_offset < 0:
            raise ConfigError(f"env_id_offset must be an int >= 0, got {env_id_offset!r}")
        if isinstance(info_keys, str):
            raise ConfigError(f"info_keys must be a sequence of names, got the str {info_keys!r}")
        self._envs: list[gym.Env] = _make_envs(env, n_envs, make_kwargs)
        self._closed = False
        try:
            if obs_dtype is not None:
                self._envs = [_cast_observations(e, obs_dtype) for e in self._envs]
            self._setup_spaces(int(seed))
        except BaseException:
            self.close()
            raise
        n = len(self._envs)
        self._n = n
        # What each step call goes to, and the time limit this VecEnv applies itself (0: none).
        self._steppers, limits = zip(*(_stepper(e) for e in self._envs))
        self._limits = np.asarray(limits, dtype=np.int64)
        self._own_limits = bool(self._limits.any())
        self._seed = int(seed)
        self._offset = int(env_id_offset)
        self._check_finite = bool(check_finite)
        self._env_info_keys = None if env_info_keys is None else tuple(env_info_keys)
        self._info_keys = tuple(info_keys)

        # Staging arrays, allocated once, written by index. ``_step_*`` get the answers of the
        # step (row j = j-th running env), ``_reset_*`` the reset observations (row k = env k).
        act = self._act
        self._step_leaves = [np.zeros((n, *lf.shape), lf.dtype) for lf in self._leaves]
        self._reset_leaves = [np.zeros((n, *lf.shape), lf.dtype) for lf in self._leaves]
        self._step_info = [np.zeros(n, np.float32) for _ in self._info_keys]
        self._reset_info = [np.zeros(n, np.float32) for _ in self._info_keys]
        self._reset_buf: dict[str, np.ndarray] = {
            lf.key: a for lf, a in zip(self._leaves, self._reset_leaves)
        }
        self._reset_buf.update(
            {
                K.REWARD: np.zeros(n, np.float32),
                K.TERMINATED: np.zeros(n, bool),
                K.TRUNCATED: np.zeros(n, bool),
                K.DONE: np.zeros(n, bool),
                K.INITIAL_STATE: np.ones(n, bool),
                K.LAST_ACTION: np.repeat(act.default[None], n, axis=0),
                K.ENV_STEP: np.zeros(n, np.int64),
            }
        )
        for name, a in zip(self._info_keys, self._reset_info):
            self._reset_buf[_INFO + name] = a
        self._frame_only = len(self._leaves) == 1 and self._leaves[0].path == ()
        self._frame_dtypes = {self._leaves[0].dtype}
        self._arange = np.arange(n)
        self._float_keys = [lf.key for lf in self._leaves if lf.dtype.kind in "fc"] + [K.REWARD]

        self._t = np.zeros(n, np.int64)  # env_step of each env
        self._options: list[dict[str, Any] | None] = [None] * n
        self._unseeded = [True] * n
        self._running: np.ndarray | None = None  # local env indices; None before reset

    def _setup_spaces(self, seed: int) -> None:
        env0 = self._envs[0]
        self.observation_space = env0.observation_space
        self.action_space = env0.action_space
        self._leaves: list[Leaf] = observation_leaves(self.observation_space)
        self._act = ActionSpec(self.action_space)
        for k, e in enumerate(self._envs):
            for what, mine, ref in (
                ("observation", e.observation_space, self.observation_space),
                ("action", e.action_space, self.action_space),
            ):
                if mine != ref:
                    raise SpaceError(
                        f"env {k} has the {what} space {mine!r}, but env 0 has {ref!r}: the "
                        "envs of one VecEnv must share their spaces"
                    )
            e.action_space.seed(seed + k)

    # ------------------------------------------------------------------ public API
    def n_envs(self) -> int:
        """``N``, the number of envs (no side effect)."""
        return self._n

    @property
    def envs(self) -> list[gym.Env]:
        """The gymnasium envs (for inspection; stepping them directly desynchronises the VecEnv)."""
        return self._envs

    def observation_specs(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """``{key: (shape without N, dtype)}`` of every observation, known before any reset."""
        return {
            k: (torch.Size(v.shape[1:]), torch_dtype(v.dtype)) for k, v in self._reset_buf.items()
        }

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, Tensor]:
        """Resets every env.

        Args:
            env_info: ``None`` or a DictTensor ``(N, ...)``; env ``k`` gets
                ``reset(options={key: row k})`` (0-d rows as Python scalars, others as numpy
                arrays), restricted to ``env_info_keys`` when the VecEnv was given some.

        Returns:
            ``(observation (N, ...), running = arange(N))``, ``running`` an int64 CPU tensor.

        Raises:
            ShapeError: ``env_info`` does not have ``N`` rows.
            KeyMismatchError: ``env_info`` lacks one of ``env_info_keys``.
        """
        self._check_open()
        self._options = env_info_options(env_info, self._n, self._env_info_keys)
        self._running = None
        for k in range(self._n):
            self._reset_env(k)
        obs = {key: torch.from_numpy(a.copy()) for key, a in self._reset_buf.items()}
        if self._check_finite:
            self._finite(obs, np.arange(self._n))
        self._running = np.arange(self._n)
        return DictTensor._trusted(obs, self._n, _CPU), torch.from_numpy(self._arange.copy())

    def close(self) -> None:
        """Closes every env (idempotent); the first error raised by an env's close is re-raised."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._running = None
        first: BaseException | None = None
        for e in self._envs:
            try:
                e.close()
            except Exception as exc:  # close them all, then report
                first = first or exc
        if first is not None:
            raise first

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n_envs={self._n}, env={self._envs[0]}, "
            f"observation_space={self.observation_space}, action_space={self.action_space})"
        )

    # ------------------------------------------------------------------ step helpers
    def _begin_step(self, action: DictTensor) -> tuple[np.ndarray, np.ndarray]:
        """Checks call order and actions; returns ``(running, actions as numpy)``."""
        self._check_open()
        return check_step(self, self._running, action, self._act, self._offset)

    def _step_envs(self, run: np.ndarray, a: np.ndarray) -> list[np.ndarray]:
        """Steps env ``run[j]`` with ``a[j]``; returns fresh arrays (row j = env ``run[j]``):
        one per observation leaf, then reward, terminated and truncated."""
        envs = self._steppers
        infos = self._step_info
        self._t[run] += 1
        acts = list(a)  # numpy scalars / rows: what gymnasium's own vector envs pass
        # ``k`` is the env being stepped while the loops run; once they are done it goes back to
        # -1, and the checks that follow name their culprit themselves (``exc.env_index``).
        k = -1
        try:
            if self._frame_only:  # the common case: collect, then build each array in one call
                answers = []
                append = answers.append
                for k, act in zip(run.tolist(), acts):
                    append(envs[k].step(act))
                k = -1
                if not answers:
                    return self._empty_step()
                try:
                    obs, rew, te, tr, info = zip(*answers)
                except (ValueError, TypeError):
                    self._check_answers(answers, run)
                    raise
                out = [self._stack_frame(obs, run)]
                if infos:
                    for j, (i_env, i) in enumerate(zip(run.tolist(), info)):
                        self._write_info(i, j, i_env, infos)
            else:
                leaves, all_leaves = self._step_leaves, self._leaves
                rew, te, tr = [], [], []
                for j, (k, act) in enumerate(zip(run.tolist(), acts)):
                    obs_k, r, terminated, truncated, info = envs[k].step(act)
                    write_leaves(obs_k, all_leaves, leaves, j, self._offset + k)
                    rew.append(r)
                    te.append(terminated)
                    tr.append(truncated)
                    if infos:
                        self._write_info(info, j, k, infos)
                k = -1
                n = run.shape[0]
                out = [x[:n].copy() for x in leaves]
            truncated = np.asarray(tr, dtype=bool)
            if self._own_limits:  # gymnasium's TimeLimit, for envs stepped past their wrappers
                limit = self._limits[run]
                truncated |= (limit > 0) & (self._t[run] >= limit)
            out += [self._rewards(rew, run), np.asarray(te, dtype=bool), truncated]
        except BaseException as e:
            self._fail(e, k, "step")
            raise
        return out

    def _empty_step(self) -> list[np.ndarray]:
        lf = self._leaves[0]
        return [
            np.zeros((0, *lf.shape), lf.dtype),
            np.zeros(0, np.float32),
            np.zeros(0, bool),
            np.zeros(0, bool),
        ]

    def _stack_frame(self, obs: Sequence[Any], run: np.ndarray) -> np.ndarray:
        """The observations of the rows as one array, exactly in the leaf's dtype (no cast).

        Fast path: one ``np.asarray`` plus one C-level pass over the values' dtypes (numpy
        promotes silently: an int16 row among float32 rows, or a float32 row among float64
        rows, would otherwise be cast). Otherwise each row is checked and the first bad one
        raises, with ``env_index`` set to ITS env (not the last env stepped).
        """
        lf = self._leaves[0]
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
                    check_leaf(v, lf, self._offset + k)  # raises unless exact (e.g. int)
                except RLStructError as e:
                    e.env_index = k  # type: ignore[attr-defined]
                    raise
        return np.asarray(obs).astype(lf.dtype)

    def _check_answers(self, answers: Sequence[Any], run: np.ndarray) -> None:
        """Raises naming the first env whose ``step`` did not return 5 values."""
        for k, answer in zip(run.tolist(), answers):
            try:
                n = len(answer)
            except TypeError:
                n = None
            if n != 5:
                got = f"{n} values" if n is not None else f"a {type(answer).__name__}"
                err = ValueError(
                    f"env {self._offset + k}: step() returned {got}, expected the 5 values of "
                    "gymnasium's API (obs, reward, terminated, truncated, info)"
                )
                err.env_index = k  # type: ignore[attr-defined]
                raise err

    def _rewards(self, rew: Sequence[Any], run: np.ndarray) -> np.ndarray:
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
        except Exception:  # ragged (an array among scalars), or a value numpy cannot take
            r = None
        if r is None or r.dtype.kind not in _REAL_KINDS or r.shape != (run.shape[0],):
            r = self._walk_rewards(rew, run)
        if r.dtype.kind == "f" and r.dtype.itemsize > 4:
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
        """The slow path of :meth:`_rewards`: float64 values, or RewardError for the first
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
            except Exception:
                a = None
            if a is not None and a.shape == () and a.dtype.kind in _REAL_KINDS:
                out[j] = a  # a 0-d array (numpy's, or a CPU tensor's)
                continue
            if isinstance(v, np.ndarray):
                what = f"an ndarray of shape {v.shape} and dtype {v.dtype}"
            else:
                what = f"{short_repr(v)} ({type(v).__name__})"
            err = RewardError(
                f"env {self._offset + k}: its reward at env_step {int(self._t[k])} is {what}; a "
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
            f"env {self._offset + k}: the reward {short_repr(v)} at env_step {int(self._t[k])} "
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

    def _step_obs(self, run: np.ndarray, a: np.ndarray, arrays: list[np.ndarray]) -> dict:
        """The ``obs_t1`` tensors of the rows just stepped (from the fresh arrays)."""
        n = run.shape[0]
        *leaves, reward, term, trunc = arrays
        obs = {lf.key: torch.from_numpy(x) for lf, x in zip(self._leaves, leaves)}
        obs[K.REWARD] = torch.from_numpy(reward)
        obs[K.TERMINATED] = torch.from_numpy(term)
        obs[K.TRUNCATED] = torch.from_numpy(trunc)
        obs[K.DONE] = torch.from_numpy(term | trunc)
        obs[K.INITIAL_STATE] = torch.zeros(n, dtype=torch.bool)
        obs[K.LAST_ACTION] = torch.from_numpy(a)
        obs[K.ENV_STEP] = torch.from_numpy(self._t[run])
        for name, x in zip(self._info_keys, self._step_info):
            obs[_INFO + name] = torch.from_numpy(x[:n].copy())
        if self._check_finite:
            self._finite(obs, run)
        return obs

    def _reset_env(self, k: int) -> None:
        """Resets env ``k``, writing its observation into row ``k`` of the reset staging."""
        seed = None
        if self._unseeded[k]:
            seed = self._seed + k
        try:
            obs, info = self._envs[k].reset(seed=seed, options=self._options[k])
            self._unseeded[k] = False
            write_leaves(obs, self._leaves, self._reset_leaves, k, self._offset + k)
            if self._info_keys:
                self._write_info(info, k, k, self._reset_info)
        except BaseException as e:
            self._fail(e, k, "reset")
            raise
        self._t[k] = 0

    def _write_info(
        self, info: Mapping[str, Any], j: int, k: int, arrays: list[np.ndarray]
    ) -> None:
        for name, arr in zip(self._info_keys, arrays):
            v = info.get(name, 0.0)
            try:
                arr[j] = v
            except (TypeError, ValueError):
                err = ConfigError(
                    f"env {self._offset + k}: info[{name!r}] is {short_repr(v)} "
                    f"({type(v).__name__}); info_keys must name numeric scalar entries"
                )
                err.env_index = k  # type: ignore[attr-defined]
                raise err from None

    def _finite(self, obs: Mapping[str, Tensor], run: np.ndarray) -> None:
        for key in self._float_keys:
            x = obs[key].numpy()
            ok = np.isfinite(x).reshape(x.shape[0], -1).all(axis=1)
            if not ok.all():
                j = int(np.flatnonzero(~ok)[0])
                k = int(run[j])
                self._running = None
                err = FloatingPointError(
                    f"env {self._offset + k}: observation key {key!r} holds {short_repr(x[j])} at "
                    f"env_step {int(self._t[k])} (check_finite=True); call reset() to go on"
                )
                err.env_index = k  # type: ignore[attr-defined]
                raise err

    def _fail(self, e: BaseException, k: int, what: str) -> None:
        """Marks the VecEnv failed and names the env of ``e``: the one a check already set in
        ``e.env_index``, else ``k`` (the env being stepped or reset; -1: none known)."""
        self._running = None
        known_index = getattr(e, "env_index", None)
        if known_index is not None:
            k = int(known_index)
        elif k >= 0:
            with contextlib.suppress(AttributeError):  # exceptions with __slots__
                e.env_index = k  # type: ignore[attr-defined]
        if k < 0:
            return
        if not isinstance(e, RLStructError) and hasattr(e, "add_note"):  # Python >= 3.11
            # k is this VecEnv's own index; a batcher reports the global one (WorkerError.env).
            known = f", global id {self._offset + k}" if self._offset else ""
            e.add_note(
                f"raised while {type(self).__name__} called {what}() of its env {k}{known} "
                f"(env_step {int(self._t[k])}); call reset() to go on"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise BatcherStateError(f"{type(self).__name__} is closed")


class GymEnv(_GymVecEnv):
    """Episodic VecEnv over ``N`` gymnasium envs: an env that ends its episode stops running.

    ``step`` takes one action row per running env and returns ``obs_t1`` for those rows and
    ``obs_next`` only for the envs still running; once every episode has ended, ``reset`` starts
    new ones.

    Args:
        env: a gymnasium id (``N`` envs made with ``gym.make(env, **make_kwargs)``) or a list of
            zero-argument factories, each returning one gymnasium env.
        n_envs: ``N`` for a gymnasium id (default 1); for factories, ``None`` or ``len(env)``.
        seed: env ``k`` is reset with ``seed + k`` on its first reset, and its action space is
            seeded ``seed + k``.
        make_kwargs: keyword arguments of ``gym.make`` (gymnasium id only).
        env_info_keys: the keys of ``env_info`` passed as reset options (default: all).
        info_keys: names of numeric entries of gymnasium's ``info`` recorded as float32
            ``info/<name>`` keys (0 where absent).
        env_id_offset: global index of env 0, used in error messages (batcher workers).
        check_finite: raise ``FloatingPointError`` (naming env, key and env_step) when a float
            observation or a reward is NaN or Inf, or a finite reward overflows float32 (without
            it, such a reward becomes inf with a ``RuntimeWarning`` naming the env).
        obs_dtype: ``None`` keeps the observations' dtype (MuJoCo's are float64); a float dtype
            (``"float32"``, ``torch.float32``...) casts a float ``Box`` observation to it, in each
            env (gymnasium's ``DtypeObservation`` wrapper: the space says the new dtype).

    Raises:
        ConfigError: bad ``env``, ``n_envs``, ``seed``, ``make_kwargs``, offset or ``obs_dtype``
            (not a float dtype, or observations that are not a float ``Box``).
        SpaceError: unsupported observation or action space, or envs with different spaces.

    Examples:
        >>> from rlstruct.envs.debug import CounterEnv
        >>> env = GymEnv([lambda: CounterEnv(episode_length=1), lambda: CounterEnv()])
        >>> obs, running = env.reset()
        >>> obs["frame"].shape, running.tolist()
        (torch.Size([2, 3]), [0, 1])
        >>> action = DictTensor({"action": torch.zeros(2, dtype=torch.long)})
        >>> (obs_t1, was), (obs_next, running) = env.step(action)
        >>> obs_t1["done"].tolist(), running.tolist(), obs_next["env_step"].tolist()
        ([True, False], [1], [1])
    """

    def step(self, action: DictTensor) -> StepResult:
        """Steps the running envs.

        Args:
            action: DictTensor with ``action`` of shape ``(n_running, *action_shape)``, rows in the
                order of ``running``.

        Returns:
            ``((obs_t1, was_running), (obs_next, still_running))``: ``obs_t1`` ``(n_running, ...)``
            answers the action (TRUE final observation at an episode end); ``obs_next`` holds the
            rows of ``obs_t1`` whose env goes on (it shares ``obs_t1``'s tensors when none ended).
            Running indices are int64 CPU tensors.

        Raises:
            BatcherStateError: no reset yet, closed, failed step, or no env running.
            ShapeError: ``action`` does not have one row per running env, or an observation
                has another shape than its space.
            ActionError: an action is outside the action space (no env was stepped).
            SpaceError: an observation has another dtype than its space (no silent cast).
            RewardError: a reward is not a real scalar number.
        """
        run, a = self._begin_step(action)
        t1 = self._step_obs(run, a, self._step_envs(run, a))
        n = run.shape[0]
        obs_t1 = DictTensor._trusted(t1, n, _CPU)
        keep = ~t1[K.DONE].numpy()
        if keep.all():
            still = run
            obs_next = DictTensor._trusted(dict(t1), n, _CPU)
        else:
            still = run[keep]
            obs_next = obs_t1.index(torch.from_numpy(keep))
        self._running = still
        return (obs_t1, torch.from_numpy(run.copy())), (obs_next, torch.from_numpy(still.copy()))


class GymEnvInf(_GymVecEnv):
    """Auto-reset VecEnv over ``N`` gymnasium envs: all ``N`` rows run forever.

    When env ``k`` ends an episode, ``obs_t1`` row ``k`` keeps its TRUE final observation (with
    ``terminated``/``truncated``) and ``obs_next`` row ``k`` holds the observation of the new
    episode (``initial_state`` True, ``env_step`` 0). The env is reset by this class (with the
    options of the last ``reset(env_info)``); gymnasium's autoreset wrappers are not used.

    Same arguments as :class:`GymEnv`.

    Examples:
        >>> from rlstruct.envs.debug import CounterEnv
        >>> env = GymEnvInf([lambda: CounterEnv(episode_length=1)])
        >>> obs, running = env.reset()
        >>> action = DictTensor({"action": torch.zeros(1, dtype=torch.long)})
        >>> (obs_t1, _), (obs_next, running) = env.step(action)
        >>> obs_t1["frame"].tolist(), obs_next["frame"].tolist(), running.tolist()
        ([[0, 0, 1]], [[0, 1, 0]], [0])
    """

    def step(self, action: DictTensor) -> StepResult:
        """Steps all ``N`` envs and resets those whose episode ended.

        Args:
            action: DictTensor with ``action`` of shape ``(N, *action_shape)``.

        Returns:
            ``((obs_t1, arange(N)), (obs_next, arange(N)))``; ``obs_next`` shares ``obs_t1``'s
            tensors when no env was reset.

        Raises:
            BatcherStateError: no reset yet, closed, or a failed step.
            ShapeError: ``action`` does not have ``N`` rows, or an observation has another
                shape than its space.
            ActionError: an action is outside the action space (no env was stepped).
            SpaceError: an observation has another dtype than its space (no silent cast).
            RewardError: a reward is not a real scalar number.
        """
        run, a = self._begin_step(action)
        arrays = self._step_envs(run, a)
        t1 = self._step_obs(run, a, arrays)
        n = self._n
        done = arrays[-2] | arrays[-1]
        if done.any():
            ended = np.flatnonzero(done)
            for k in ended.tolist():
                self._reset_env(k)
            nxt = {}
            for key, v in t1.items():
                # numpy views of t1's tensors: patch a copy with the reset rows.
                x = v.numpy().copy()
                x[ended] = self._reset_buf[key][ended]
                nxt[key] = torch.from_numpy(x)
            if self._check_finite:
                self._finite(nxt, run)
        else:
            nxt = dict(t1)
        # Fresh index tensors: a caller may modify them in place.
        return (DictTensor._trusted(t1, n, _CPU), torch.from_numpy(run.copy())), (
            DictTensor._trusted(nxt, n, _CPU),
            torch.from_numpy(run.copy()),
        )


def _cast_observations(env: gym.Env, dtype: str | np.dtype | torch.dtype) -> gym.Env:
    """``env`` with its float ``Box`` observations cast to ``dtype`` (the ``obs_dtype`` option).

    Raises:
        ConfigError: ``dtype`` is not a float dtype, or the observations are not a float Box.
    """
    why = f"obs_dtype must be a float dtype such as 'float32', got {dtype!r}"
    try:
        target = np.dtype(torch.empty(0, dtype=dtype).numpy().dtype
                          if isinstance(dtype, torch.dtype) else dtype)
    except TypeError as e:
        raise ConfigError(why) from e
    if target.kind != "f":
        raise ConfigError(why)
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or space.dtype.kind != "f":
        raise ConfigError(
            f"obs_dtype={dtype!r} casts float Box observations, but the env has {space!r}; "
            "cast other observations with a gymnasium ObservationWrapper"
        )
    if space.dtype == target:
        return env
    with warnings.catch_warnings():  # gymnasium's Box warns about casting its bounds (+-inf)
        warnings.filterwarnings("ignore", ".*precision lowered", UserWarning)
        warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
        return gym.wrappers.DtypeObservation(env, target)


def _make_envs(
    env: str | Sequence[EnvFactory], n_envs: int | None, make_kwargs: Mapping[str, Any] | None
) -> list[gym.Env]:
    """Builds the envs of a VecEnv: ``n_envs`` ``gym.make(env)`` or one env per factory.

    Args:
        env: a gymnasium id, or a non-empty list of zero-argument factories.
        n_envs: the number of envs for an id (default 1); ``None`` or ``len(env)`` for factories.
        make_kwargs: keyword arguments of ``gym.make`` (id only).

    Returns:
        The envs, distinct objects over distinct underlying envs.

    Raises:
        ConfigError: a bad ``env`` or ``n_envs`` (with what changed since rlstructures when the
            call looks like rlstructures' ``GymEnv(envs, seed)``), a factory that returns no
            gymnasium env, or factories that return the same env twice. Every env built before
            the error is closed, each once.
    """
    _refuse_env_instances(env, n_envs)
    factory_list = isinstance(env, Sequence) and not isinstance(env, str)
    if n_envs is not None and (
        isinstance(n_envs, bool) or not isinstance(n_envs, (int, np.integer)) or n_envs < 1
    ):
        raise ConfigError(
            f"n_envs must be an int >= 1 or None, got {n_envs!r}"
            + (_SECOND_ARGUMENT.format(n=n_envs) if factory_list else "")
        )
    if isinstance(env, str):
        factories: list[EnvFactory] = [lambda: gym.make(env, **(make_kwargs or {}))] * (
            1 if n_envs is None else int(n_envs)
        )
    elif factory_list and env and all(callable(f) for f in env):
        if make_kwargs:
            raise ConfigError("make_kwargs only applies when env is a gymnasium id")
        if n_envs is not None and n_envs != len(env):
            raise ConfigError(
                f"n_envs={n_envs} but {len(env)} env factories were given"
                + _SECOND_ARGUMENT.format(n=n_envs)
            )
        factories = list(env)
    else:
        raise ConfigError(
            f"env must be a gymnasium id or a non-empty list of zero-argument env factories, "
            f"got {short_repr(env)}"
        )
    envs: list[gym.Env] = []
    try:
        for k, factory in enumerate(factories):
            e = factory()
            if not isinstance(e, gym.Env):
                raise ConfigError(
                    f"env factory {k} returned {type(e).__name__}, not a gymnasium.Env"
                )
            envs.append(e)
        _refuse_shared_envs(envs)
    except BaseException as exc:
        if not isinstance(exc, RLStructError) and hasattr(exc, "add_note"):
            exc.add_note(f"raised while building env {len(envs)}")
            if isinstance(exc, TypeError) and "max_episode_steps" in str(exc):
                exc.add_note(_TIME_LIMIT_HINT)
        _close_once(envs)
        raise
    return envs


#: Appended to n_envs errors when env is a list: rlstructures' GymEnv took the seed second.
_SECOND_ARGUMENT = (
    "; GymEnv's second argument is n_envs (the number of envs, default len(env) for factories), "
    "not the seed as in rlstructures' GymEnv(envs, seed): if {n!r} is a seed, pass it as the "
    "keyword seed={n!r}"
)

#: Added to gymnasium's TypeError for ``TimeLimit(env, max_episode_steps=None)``.
_TIME_LIMIT_HINT = (
    "gymnasium's TimeLimit needs an int max_episode_steps (gym's accepted None for the "
    "registered limit): write gym.make(env_id, max_episode_steps=n), which keeps the registered "
    "limit when n is None, or wrap with TimeLimit only when n is not None"
)


def _is_env_instance(x: object) -> bool:
    """A gymnasium env, or an object with ``step`` and ``reset`` that is not a factory (gym's)."""
    return isinstance(x, gym.Env) or (
        not callable(x) and hasattr(x, "step") and hasattr(x, "reset")
    )


def _env_name(e: object) -> str:
    """The gymnasium id of an env (from its spec), else its class name."""
    spec = getattr(e, "spec", None)
    return str(getattr(spec, "id", None) or type(e).__name__)


def _refuse_env_instances(env: object, n_envs: object) -> None:
    """Refuses env instances where factories are expected, saying what changed since
    rlstructures (whose ``GymEnv(gym_env, seed)`` took a list of instances and the seed second).

    Raises:
        ConfigError: ``env`` is an env instance, or a list holding one.
    """
    if _is_env_instance(env):
        name = _env_name(env)
        raise ConfigError(
            f"env is an env instance ({name}), but GymEnv builds its envs itself: pass a "
            f"gymnasium id (GymEnv({_id_or(name, 'CartPole-v1')!r}, n_envs=n, seed=s)) or a list "
            "of zero-argument factories that each build a fresh env; to keep this env instance "
            "e, pass [lambda: e]"
        )
    if not isinstance(env, Sequence) or isinstance(env, str):
        return
    where = [k for k, x in enumerate(env) if _is_env_instance(x)]
    if not where:
        return
    n = len(env)
    names = sorted({_env_name(env[k]) for k in where})
    if len(where) == n:
        what = f"a list of {n} env instance{'s' if n > 1 else ''} ({', '.join(names)})"
    else:
        what = (
            f"env instances at positions {_enumerate(where)}"
            if len(where) > 1
            else f"an env instance at position {where[0]}"
        ) + f" ({', '.join(names)}) among factories"
    changed = "rlstruct takes zero-argument factories that each build a fresh env"
    if n_envs is None:
        seed = "s"
        what += f": rlstructures' GymEnv(envs, seed) took env instances, {changed}"
    else:
        seed = repr(n_envs)
        what += (
            f" and n_envs={n_envs!r}: this is rlstructures' GymEnv(envs, seed), which changed: "
            f"{changed}, its second argument is n_envs (default: one env per factory) and the "
            "seed is the keyword seed="
        )
    ids = {_id_or(name, "") for name in names} - {""}
    by_id = f"GymEnv({ids.pop()!r}, n_envs={n}, seed={seed}), or " if len(ids) == 1 else ""
    raise ConfigError(
        f"GymEnv got {what}. Write {by_id}GymEnv([make_env] * {n}, seed={seed}) where make_env() "
        "builds one env (wrappers included); to keep envs already built, bind each one: "
        f"GymEnv([lambda e=e: e for e in envs], seed={seed}) (in [lambda: e for e in envs] "
        "every lambda returns the last env)"
    )


def _id_or(name: str, default: str) -> str:
    """``name`` if it looks like a gymnasium id (``Name-v<k>``), else ``default``."""
    return name if "-v" in name else default


def _refuse_shared_envs(envs: Sequence[gym.Env]) -> None:
    """Refuses factories that returned one env object (or wrappers of one env) more than once.

    A VecEnv would step that one env several times per step: the classic cause is Python's late
    binding, ``[lambda: e for e in envs]`` (every lambda returns the last ``e``).

    Raises:
        ConfigError: naming the factories that share an env.
    """
    groups: dict[int, list[int]] = {}
    for k, e in enumerate(envs):
        groups.setdefault(id(e.unwrapped), []).append(k)
    shared = [ks for ks in groups.values() if len(ks) > 1]
    if not shared:
        return
    parts = []
    for ks in shared:
        same = all(envs[k] is envs[ks[0]] for k in ks)
        obj = "the same env object" if same else "wrappers of the same env object"
        parts.append(f"env factories {_enumerate(ks)} returned {obj} ({_env_name(envs[ks[0]])})")
    example = _id_or(_env_name(envs[shared[0][0]]), "CartPole-v1")
    raise ConfigError(
        f"{'; '.join(parts)}: the VecEnv would step one env several times per step. In "
        "[lambda: e for e in envs] every lambda returns the last e (Python's late binding): "
        "bind each env with [lambda e=e: e for e in envs], or better give factories that each "
        f"build a fresh env (e.g. [lambda: gym.make({example!r})] * n)"
    )


def _close_once(envs: Sequence[gym.Env]) -> None:
    """Closes the envs of a refused or failed construction, each underlying env once, ignoring
    errors raised by ``close`` (the construction error is the one to report)."""
    closed: set[int] = set()
    for e in envs:
        base = id(e.unwrapped)
        if base in closed:
            continue
        closed.add(base)
        with contextlib.suppress(Exception):
            e.close()


def _enumerate(indices: Sequence[int]) -> str:
    """``0``, ``0 and 1``, ``0, 1 and 2``."""
    names = [str(k) for k in indices]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


#: Wrappers that ``gym.make`` adds by default and that a VecEnv can do without: it checks
#: actions and observations itself, enforces reset-before-step, and applies the time limit.
_STANDARD_WRAPPERS = (
    gym.wrappers.TimeLimit,
    gym.wrappers.OrderEnforcing,
    gym.wrappers.PassiveEnvChecker,
)


def _stepper(env: gym.Env) -> tuple[Any, int]:
    """What to call ``step`` on for ``env``, and the time limit to apply (0: none).

    An env wrapped by nothing but ``gym.make``'s standard wrappers (TimeLimit, OrderEnforcing,
    PassiveEnvChecker) is stepped through ``env.unwrapped``: the VecEnv validates actions and
    observations itself, refuses a step before reset, and applies the TimeLimit (truncated once
    ``env_step`` reaches ``max_episode_steps``, as the wrapper does), which saves three calls per
    env and step. Any other wrapper (a user's, Atari preprocessing) keeps the whole chain. Resets
    always go through the whole chain. For a ``Discrete`` action space the unwrapped env's
    ``action_space.contains`` gets a fast path for the int64 scalars the VecEnv passes (the same
    answer, without numpy's dtype introspection): gymnasium's classic envs assert it every step.
    """
    limit = 0
    inner = env
    while isinstance(inner, gym.Wrapper):
        if not isinstance(inner, _STANDARD_WRAPPERS) or type(inner) not in _STANDARD_WRAPPERS:
            return env, 0
        if isinstance(inner, gym.wrappers.TimeLimit):
            limit = int(getattr(inner, "_max_episode_steps", 0) or 0)
            if limit <= 0:
                return env, 0
        inner = inner.env
    space = inner.action_space
    if type(space) is gym.spaces.Discrete and space.dtype == np.int64:
        space.contains = _FastDiscreteContains(space)  # type: ignore[method-assign]
    return inner, limit


class _FastDiscreteContains:
    """``Discrete.contains`` with a fast path for numpy int64 scalars (the VecEnv's actions)."""

    def __init__(self, space: gym.spaces.Discrete) -> None:
        self._low = int(space.start)
        self._high = int(space.start) + int(space.n)
        self._general = type(space).contains.__get__(space)

    def __call__(self, x: Any) -> bool:
        if x.__class__ is np.int64:
            return self._low <= x < self._high
        return self._general(x)


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
    if run is None:
        raise BatcherStateError(
            f"{name}.step called before reset() (or after a failed step); call reset() first"
        )
    if run.shape[0] == 0:
        raise BatcherStateError(
            f"{name}.step called with no running env: every episode has ended; call reset() "
            "to start new ones"
        )
    if not isinstance(action, DictTensor):
        raise TypeError(f"step takes a DictTensor, got {type(action).__name__}")
    a = action[K.ACTION_KEY]
    if a.shape[0] != run.shape[0]:
        raise ShapeError(
            f"action has {a.shape[0]} rows, expected {run.shape[0]} (one per running env, "
            "in the order of `running`)"
        )
    if a.device.type != "cpu":
        raise DeviceContractError(
            f"{name} steps CPU envs, but the action is on {a.device}; wrap the VecEnv with "
            "DeviceEnv(env, 'cpu', device) to move actions back",
            argument="action",
            key=K.ACTION_KEY,
            expected=_CPU,
            actual=a.device,
        )
    return run, act.to_numpy(a, run, offset)

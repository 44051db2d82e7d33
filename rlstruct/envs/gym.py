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

Failures: an invalid action raises :class:`ActionError` before any env is stepped, and the VecEnv
stays usable. Any error raised once envs have been stepped (by an env, or an observation that
does not match its space) leaves the envs half-stepped: the next ``step`` asks for a ``reset``.
Every error about one env (those, :class:`ActionError`, ``FloatingPointError``) carries
``exc.env_index``, the LOCAL index of the env in this VecEnv (batchers add their offset), and
errors raised by the env itself get a note naming the env by its global index.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
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
    RLStructError,
    ShapeError,
    SpaceError,
)

__all__ = ["GymEnv", "GymEnvInf", "EnvFactory"]

#: A zero-argument callable that builds one gymnasium env (must be picklable for worker batchers).
EnvFactory = Callable[[], gym.Env]

_CPU = torch.device("cpu")
_INFO = "info/"


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
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"seed must be an int >= 0, got {seed!r}")
        if not isinstance(env_id_offset, (int, np.integer)) or env_id_offset < 0:
            raise ConfigError(f"env_id_offset must be an int >= 0, got {env_id_offset!r}")
        if isinstance(info_keys, str):
            raise ConfigError(f"info_keys must be a sequence of names, got the str {info_keys!r}")
        self._envs: list[gym.Env] = _make_envs(env, n_envs, make_kwargs)
        self._closed = False
        try:
            self._setup_spaces(int(seed))
        except BaseException:
            self.close()
            raise
        n = len(self._envs)
        self._n = n
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
        run = self._running
        if run is None:
            raise BatcherStateError(
                f"{type(self).__name__}.step called before reset() (or after a failed step); "
                "call reset() first"
            )
        if run.shape[0] == 0:
            raise BatcherStateError(
                f"{type(self).__name__}.step called with no running env: every episode has "
                "ended; call reset() to start new ones"
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
                f"{type(self).__name__} steps CPU envs, but the action is on {a.device}; wrap "
                "the VecEnv with DeviceEnv(env, 'cpu', device) to move actions back",
                argument="action",
                key=K.ACTION_KEY,
                expected=_CPU,
                actual=a.device,
            )
        return run, self._act.to_numpy(a, run, self._offset)

    def _step_envs(self, run: np.ndarray, a: np.ndarray) -> list[np.ndarray]:
        """Steps env ``run[j]`` with ``a[j]``; returns fresh arrays (row j = env ``run[j]``):
        one per observation leaf, then reward, terminated and truncated."""
        envs = self._envs
        infos = self._step_info
        self._t[run] += 1
        acts = list(a)  # numpy scalars / rows: what gymnasium's own vector envs pass
        k = -1
        try:
            if self._frame_only:  # the common case: collect, then build each array in one call
                answers = []
                append = answers.append
                for k, act in zip(run.tolist(), acts):
                    append(envs[k].step(act))
                if not answers:
                    return self._empty_step()
                obs, rew, te, tr, info = zip(*answers)
                out = [self._stack_frame(obs, run)]
                if infos:
                    for j, (k, i) in enumerate(zip(run.tolist(), info)):
                        self._write_info(i, j, k, infos)
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
                n = run.shape[0]
                out = [x[:n].copy() for x in leaves]
        except BaseException as e:
            self._fail(e, k, "step")
            raise
        return [
            *out,
            np.asarray(rew, dtype=np.float32),
            np.asarray(te, dtype=bool),
            np.asarray(tr, dtype=bool),
        ]

    def _empty_step(self) -> list[np.ndarray]:
        lf = self._leaves[0]
        return [
            np.zeros((0, *lf.shape), lf.dtype),
            np.zeros(0, np.float32),
            np.zeros(0, bool),
            np.zeros(0, bool),
        ]

    def _stack_frame(self, obs: Sequence[Any], run: np.ndarray) -> np.ndarray:
        """The observations of the rows as one array, exactly in the leaf's dtype (no cast)."""
        lf = self._leaves[0]
        try:
            frame = np.asarray(obs)
        except ValueError:  # ragged shapes: find the culprit below
            frame = None
        if frame is None or frame.dtype != lf.dtype or frame.shape[1:] != lf.shape:
            for k, v in zip(run.tolist(), obs):
                if v.__class__ is not np.ndarray or v.dtype != lf.dtype or v.shape != lf.shape:
                    check_leaf(v, lf, self._offset + k)  # raises unless exact (e.g. int)
            frame = np.asarray(obs).astype(lf.dtype)
        elif frame.base is not None or not frame.flags.writeable:
            frame = frame.copy()
        return frame

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
                raise ConfigError(
                    f"env {self._offset + k}: info[{name!r}] is {short_repr(v)} "
                    f"({type(v).__name__}); info_keys must name numeric scalar entries"
                ) from None

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
        self._running = None
        if k < 0:
            return
        if getattr(e, "env_index", None) is None:
            with contextlib.suppress(AttributeError):  # exceptions with __slots__
                e.env_index = k  # type: ignore[attr-defined]
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
            observation or a reward is NaN or Inf.

    Raises:
        ConfigError: bad ``env``, ``n_envs``, ``seed``, ``make_kwargs`` or offset.
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
            ShapeError: ``action`` does not have one row per running env.
            ActionError: an action is outside the action space (no env was stepped).
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
            ShapeError: ``action`` does not have ``N`` rows.
            ActionError: an action is outside the action space (no env was stepped).
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


def _make_envs(
    env: str | Sequence[EnvFactory], n_envs: int | None, make_kwargs: Mapping[str, Any] | None
) -> list[gym.Env]:
    if n_envs is not None and (
        isinstance(n_envs, bool) or not isinstance(n_envs, (int, np.integer)) or n_envs < 1
    ):
        raise ConfigError(f"n_envs must be an int >= 1 or None, got {n_envs!r}")
    if isinstance(env, str):
        factories: list[EnvFactory] = [lambda: gym.make(env, **(make_kwargs or {}))] * (
            1 if n_envs is None else int(n_envs)
        )
    elif isinstance(env, Sequence) and env and all(callable(f) for f in env):
        if make_kwargs:
            raise ConfigError("make_kwargs only applies when env is a gymnasium id")
        if n_envs is not None and n_envs != len(env):
            raise ConfigError(f"n_envs={n_envs} but {len(env)} env factories were given")
        factories = list(env)
    else:
        raise ConfigError(
            f"env must be a gymnasium id or a non-empty list of zero-argument env factories, "
            f"got {short_repr(env)}; to wrap an env instance e, pass [lambda: e]"
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
    except BaseException as exc:
        if not isinstance(exc, RLStructError) and hasattr(exc, "add_note"):
            exc.add_note(f"raised while building env {len(envs)}")
        for e in envs:
            e.close()
        raise
    return envs

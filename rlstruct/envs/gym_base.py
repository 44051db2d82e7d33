"""The machinery of the gymnasium VecEnvs: ``N`` gymnasium envs stepped one after the other,
their answers checked and written into fresh numpy arrays; :class:`~rlstruct.envs.GymEnv` and
:class:`~rlstruct.envs.GymEnvInf` (:mod:`rlstruct.envs.gym`, where the contract is described)
build their ``step`` on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.envs.factories import EnvFactory, cast_observations, make_envs, refuse_env_instances
from rlstruct.envs.masks import check_masks, info_mask
from rlstruct.envs.spaces import (
    ActionSpec,
    Leaf,
    env_info_options,
    exact_leaf,
    observation_leaves,
    torch_dtype,
    write_leaves,
)
from rlstruct.envs.step_checks import (
    AnswerChecker,
    check_finite_rewards,
    check_observations,
    check_step,
    name_failed_env,
    write_info,
)
from rlstruct.envs.unwrap import stepper
from rlstruct.errors import (
    BatcherStateError,
    ConfigError,
    ObservationError,
    SpaceError,
)

__all__: list[str] = []

_CPU = torch.device("cpu")
_INFO = "info/"


class GymVecEnv(VecEnv):
    """What :class:`~rlstruct.envs.GymEnv` and :class:`~rlstruct.envs.GymEnvInf` share: the
    envs, their spaces, the staging arrays, ``reset``, the stepping of the envs and the checks
    of their answers; the subclasses add ``step`` (see :mod:`rlstruct.envs.gym`)."""

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
        check_obs: bool = True,
        action_mask: bool | None = None,
    ) -> None:
        # First: rlstructures' GymEnv(envs, seed) (env instances, the seed second) gets an error
        # saying what changed, whatever its other arguments hold.
        refuse_env_instances(env, n_envs)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"seed must be an int >= 0, got {seed!r}")
        if not isinstance(env_id_offset, (int, np.integer)) or env_id_offset < 0:
            raise ConfigError(f"env_id_offset must be an int >= 0, got {env_id_offset!r}")
        if isinstance(info_keys, str):
            raise ConfigError(f"info_keys must be a sequence of names, got the str {info_keys!r}")
        self._envs: list[gym.Env] = make_envs(env, n_envs, make_kwargs)
        self._closed = False
        try:
            if obs_dtype is not None:
                self._envs = [cast_observations(e, obs_dtype) for e in self._envs]
            self._setup_spaces(int(seed))
            # The info route of the action mask (rlstruct.envs.masks): None until the first
            # reset decides (action_mask=None), then whether info["action_mask"] is recorded.
            self._mask_info = self._mask_route(action_mask)
        except BaseException:
            self.close()
            raise
        n = len(self._envs)
        self._n = n
        # What each step call goes to, and the time limit this VecEnv applies itself (0: none).
        self._steppers, limits = zip(*(stepper(e) for e in self._envs))
        self._step_fns = [s.step for s in self._steppers]  # bound once: no lookup per step
        limits = np.asarray(limits, dtype=np.int64)
        self._own_limits = bool(limits.any())
        # The step at which each env is truncated (no limit: never), compared in one operation.
        self._limits = np.where(limits > 0, limits, np.iinfo(np.int64).max)
        self._seed = int(seed)
        self._offset = int(env_id_offset)
        self._check_finite = bool(check_finite)
        self._check_obs = bool(check_obs)
        self._env_info_keys = None if env_info_keys is None else tuple(env_info_keys)
        self._info_keys = tuple(info_keys)

        self._allocate_staging(n)
        self._frame_only = len(self._leaves) == 1 and self._leaves[0].path == ()
        self._arange = np.arange(n)
        # The float observation leaves checked for NaN and infinities at every step and reset
        # (check_obs; check_finite implies it), as (index in self._leaves, key).
        self._obs_checked = [
            (i, lf.key) for i, lf in enumerate(self._leaves) if lf.dtype.kind == "f"
        ] if (self._check_obs or self._check_finite) else []

        self._t = np.zeros(n, np.int64)  # env_step of each env
        self._check = AnswerChecker(
            self._leaves[0] if self._frame_only else None, self._offset, self._t,
            self._check_finite,
        )
        self._options: list[dict[str, Any] | None] = [None] * n
        self._unseeded = [True] * n
        # What each reset calls: the whole chain the first time (gymnasium's checks and
        # OrderEnforcing see it), then what ``step`` calls (see rlstruct.envs.unwrap.stepper).
        self._resetters: list[gym.Env] = list(self._envs)
        self._running: np.ndarray | None = None  # local env indices; None before reset

    def _allocate_staging(self, n: int) -> None:
        """Allocates the staging arrays of ``n`` envs, once, written by index: ``_step_*`` get
        the answers of the step (row j = j-th running env), ``_reset_*`` the reset observations
        (row k = env k)."""
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
        if self._mask_info:
            self._allocate_masks(n)

    def _mask_route(self, action_mask: bool | None) -> bool | None:
        """Whether ``info["action_mask"]`` is recorded (None: the first reset decides)."""
        if action_mask is False or any(lf.key == K.ACTION_MASK for lf in self._leaves):
            return False  # ignored, or an observation leaf already (the Dict route)
        if not isinstance(self.action_space, gym.spaces.Discrete):
            if action_mask:
                raise ConfigError(f"action_mask=True needs a Discrete action space, got "
                                  f"{self.action_space!r}")
            return False
        return True if action_mask else None

    def _allocate_masks(self, n: int) -> None:
        """The staging of the info route's masks (all legal until written)."""
        shape = (n, int(self.action_space.n))  # type: ignore[attr-defined]
        self._step_mask, self._reset_mask = np.ones(shape, bool), np.ones(shape, bool)
        self._reset_buf[K.ACTION_MASK] = self._reset_mask

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
            ObservationError: a float reset observation holds NaN or an infinity
                (``check_obs``).
            ActionMaskError: a reset observation's action mask allows no action.
        """
        self._check_open()
        self._options = env_info_options(env_info, self._n, self._env_info_keys)
        self._running = None
        for k in range(self._n):
            self._reset_env(k)
        self._check_reset_obs()
        obs = {key: a.copy() for key, a in self._reset_buf.items()}
        self._running = np.arange(self._n)
        return numpy_dicttensor(obs, self._n), torch.from_numpy(self._arange.copy())

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
            except Exception as exc:  # noqa: BLE001 - close them all, then re-raise the first
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
        infos = self._step_info
        full = run.shape[0] == self._n  # then ``run`` is arange(N): whole arrays, no gather
        if full:
            self._t += 1
            fns = self._step_fns
        else:
            self._t[run] += 1
            fns = [self._step_fns[k] for k in run.tolist()]
        acts = list(a)  # numpy scalars / rows: what gymnasium's own vector envs pass
        # ``k`` is the env being stepped while the loops run; once they are done it goes back to
        # -1, and the checks that follow name their culprit themselves (``exc.env_index``).
        k = -1
        try:
            if self._frame_only:  # the common case: collect, then build each array in one call
                answers: list[Any] = []
                append = answers.append
                try:
                    for step, act in zip(fns, acts):
                        append(step(act))
                except BaseException:
                    k = int(run[len(answers)])  # the env whose step raised
                    raise
                if not answers:
                    return self._empty_step()
                try:
                    obs, rew, te, tr, info = zip(*answers)
                except (ValueError, TypeError):
                    self._check.answers(answers, run)
                    raise
                out = [self._check.frame(obs, run)]
                if self._reads_info:
                    for j, (i_env, i) in enumerate(zip(run.tolist(), info)):
                        self._write_info(i, j, i_env, infos)
            else:
                leaves, all_leaves = self._step_leaves, self._leaves
                rew, te, tr = [], [], []
                for j, (k, step, act) in enumerate(zip(run.tolist(), fns, acts)):
                    obs_k, r, terminated, truncated, info = step(act)
                    write_leaves(obs_k, all_leaves, leaves, j, self._offset + k)
                    rew.append(r)
                    te.append(terminated)
                    tr.append(truncated)
                    if self._reads_info:
                        self._write_info(info, j, k, infos)
                k = -1
                n = run.shape[0]
                out = [x[:n].copy() for x in leaves]
            if self._obs_checked:
                check_observations(out, self._obs_checked, run, self._offset, self._t)
            truncated = np.asarray(tr, dtype=bool)
            if self._own_limits:  # gymnasium's TimeLimit, for envs stepped past their wrappers
                if full:
                    truncated |= self._t >= self._limits
                else:
                    truncated |= self._t[run] >= self._limits[run]
            out += [self._check.rewards(rew, run), np.asarray(te, dtype=bool), truncated]
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

    def _step_obs(
        self, run: np.ndarray, a: np.ndarray, arrays: list[np.ndarray]
    ) -> dict[str, np.ndarray]:
        """The ``obs_t1`` arrays of the rows just stepped (fresh: none aliases a staging array,
        so each becomes a tensor with ``torch.from_numpy`` and no further copy)."""
        n = run.shape[0]
        *leaves, reward, term, trunc = arrays
        obs = {lf.key: x for lf, x in zip(self._leaves, leaves)}
        obs[K.REWARD] = reward
        obs[K.TERMINATED] = term
        obs[K.TRUNCATED] = trunc
        obs[K.DONE] = term | trunc
        obs[K.INITIAL_STATE] = np.zeros(n, bool)
        obs[K.LAST_ACTION] = a
        obs[K.ENV_STEP] = self._t.copy() if n == self._n else self._t[run]
        for name, x in zip(self._info_keys, self._step_info):
            obs[_INFO + name] = x[:n].copy()
        if self._mask_info:
            obs[K.ACTION_MASK] = self._step_mask[:n].copy()
        if K.ACTION_MASK in obs:  # the rows an agent acts on allow an action
            try:
                check_masks(obs[K.ACTION_MASK], run, ~obs[K.DONE], self._offset, self._t)
            except BaseException:
                self._running = None
                raise
        if self._check_finite:
            self._finite_rewards(obs[K.REWARD], run)
        return obs

    def _reset_env(self, k: int) -> None:
        """Resets env ``k``, writing its observation into row ``k`` of the reset staging."""
        seed = self._seed + k if self._unseeded[k] else None
        try:
            obs, info = self._resetters[k].reset(seed=seed, options=self._options[k])
            if self._mask_info is None:  # the first reset: does info give the mask?
                self._mask_info = K.ACTION_MASK in info
                if self._mask_info:
                    self._allocate_masks(self._n)
            self._unseeded[k] = False
            self._resetters[k] = self._steppers[k]
            if self._frame_only and exact_leaf(obs, self._leaves[0]):
                self._reset_leaves[0][k] = obs  # what write_leaves accepts without a look
            else:
                write_leaves(obs, self._leaves, self._reset_leaves, k, self._offset + k)
            if self._reads_info:
                self._write_info(info, k, k, self._reset_info)
        except BaseException as e:
            self._fail(e, k, "reset")
            raise
        self._t[k] = 0

    def _check_reset_obs(self) -> None:
        """``check_obs``: raises ObservationError for a reset observation holding NaN or an
        infinity. The whole reset staging is checked in one pass per float key (row k holds env
        k's last reset observation; the rows not reset since were checked then). A reset
        observation's action mask must allow an action (ActionMaskError)."""
        if K.ACTION_MASK in self._reset_buf:
            try:
                check_masks(self._reset_buf[K.ACTION_MASK], self._arange,
                            np.ones(self._n, bool), self._offset, self._t)
            except BaseException:
                self._running = None
                raise
        if self._obs_checked:
            try:
                check_observations(
                    self._reset_leaves, self._obs_checked, self._arange, self._offset, self._t,
                    reset=True,
                )
            except ObservationError:
                self._running = None
                raise

    @property
    def _reads_info(self) -> bool:
        """Whether the envs' ``info`` is read (``info_keys``, or the action mask)."""
        return bool(self._info_keys) or bool(self._mask_info)

    def _write_info(
        self, info: Mapping[str, Any], j: int, k: int, arrays: list[np.ndarray]
    ) -> None:
        """Writes env ``k``'s ``info`` into row ``j`` of ``arrays`` (the step's or the reset's
        staging), and its action mask into the matching mask staging."""
        write_info(self._info_keys, info, arrays, j, k, self._offset)
        if self._mask_info:
            masks = self._reset_mask if arrays is self._reset_info else self._step_mask
            masks[j] = info_mask(info, masks.shape[1], k, self._offset)

    def _finite_rewards(self, reward: np.ndarray, run: np.ndarray) -> None:
        """``check_finite``: raises FloatingPointError for the first NaN or infinite reward
        (the observations are checked in :meth:`_step_envs` and :meth:`_reset_env`)."""
        if not np.isfinite(reward).all():
            self._running = None
            check_finite_rewards(reward, run, self._t, self._offset)

    def set_env_id_offset(self, offset: int) -> None:
        """Sets the global index of env 0 (what error messages name; see
        :meth:`VecEnv.set_env_id_offset`).

        Raises:
            ConfigError: ``offset`` is not an int >= 0.
        """
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
            raise ConfigError(f"env_id_offset must be an int >= 0, got {offset!r}")
        self._offset = int(offset)
        self._check.offset = self._offset

    def _fail(self, e: BaseException, k: int, what: str) -> None:
        """Marks the VecEnv failed and names the env of ``e`` (:func:`name_failed_env`)."""
        self._running = None
        name_failed_env(e, k, what, type(self).__name__, self._offset, self._t)

    def _check_open(self) -> None:
        if self._closed:
            raise BatcherStateError(f"{type(self).__name__} is closed")


def numpy_dicttensor(arrays: dict[str, np.ndarray], n: int) -> DictTensor:
    """A CPU DictTensor over fresh numpy arrays of ``n`` rows (shared memory, no copy)."""
    return DictTensor.trusted({k: torch.from_numpy(x) for k, x in arrays.items()}, n, _CPU)

"""``VectorEnvAdapter``: a user's ``gymnasium.vector.VectorEnv`` as one auto-reset VecEnv.

GPU simulators and envpool-like libraries ship their batch of ``N`` envs as a
``gymnasium.vector.VectorEnv``: one ``step`` call for all ``N`` envs, batched numpy arrays back.
This module maps such an env onto the VecEnv contract (:mod:`rlstruct.envs.base`) with the keys,
shapes and dtypes of :class:`~rlstruct.envs.GymEnvInf`: the env's own observation leaves
(``frame``, or one key per leaf of a ``Dict`` or ``Tuple`` space, exactly in the space's dtype),
``reward`` (float32), ``terminated``, ``truncated``, ``done``, ``initial_state`` (bool),
``last_action`` (the action space's shape and dtype; its default at reset) and ``env_step``
(int64, 0 at reset). All ``N`` envs run forever (a vector env steps all its envs at once: there
is no episodic variant).

**Auto-reset modes.** Gymnasium 1.x vector envs reset an ended env in one of three ways, which
the env states in ``metadata["autoreset_mode"]`` (an ``AutoresetMode`` or its string value);
the adapter reads it when it is built and gives the same Trajectories in each:

- ``SAME_STEP``: the step that ends an episode returns the first observation of the next one,
  and the TRUE final observation in ``info["final_obs"]`` (gymnasium's object array with one
  entry per env, or a batched observation). ``obs_t1`` gets the final observation of the ended
  envs, ``obs_next`` the returned one.
- ``NEXT_STEP``: the step that ends an episode returns its final observation, and the env's NEXT
  ``step`` would reset it, ignoring its action (a phantom transition if the agent's action were
  spent there). The adapter never leaves that step to the agent: in the step where envs end, it
  resets exactly those with gymnasium's partial reset, ``reset(options={"reset_mask": done})``
  (``SyncVectorEnv`` and ``AsyncVectorEnv`` take it), which also clears the env's pending
  auto-reset. ``obs_next`` gets its observations, and the agent's next action is executed in
  the new episode.
- ``DISABLED``: the env never resets itself; the adapter resets the ended envs as for
  ``NEXT_STEP``.

A vector env that ignores ``reset_mask`` (it resets every env, e.g. gymnasium's own
``CartPoleVectorEnv``) is caught at the first episode end: the rows it should have left alone
changed, and a :class:`~rlstruct.errors.BatcherStateError` says so (use ``SAME_STEP`` there).
gymnasium 1.4's ``AsyncVectorEnv(shared_memory=False)`` in ``NEXT_STEP`` mode resets the masked
envs but keeps their pending auto-reset, which would drop an action per episode end: it is
refused at construction (``shared_memory=True``, gymnasium's default, works).
A missing or unknown mode raises :class:`~rlstruct.errors.AutoresetModeError` at construction.

**Seeds.** ``VectorEnvAdapter(..., seed=s)`` calls ``reset(seed=s)`` on the env's FIRST reset
only; gymnasium's ``SyncVectorEnv`` and ``AsyncVectorEnv`` seed sub-env ``k`` with ``s + k``,
which is rlstruct's rule (:class:`~rlstruct.envs.GymEnvInf` gives env ``k`` ``s + k``), so the
same sub-envs start from the same states (another vector env applies its own rule to the int
``s``). Later resets (``reset()``, the partial resets, the env's own auto-resets) continue each
env's own random stream. The single-env action space is seeded with ``s``.

**Batchers.** ``create_env=VectorEnvAdapter`` with ``env_args={"make_env": factory,
"n_envs": n}``: each batcher process (``SerialBatcher``: the caller's, ``Batcher``: each worker,
the Ray batcher: each actor) builds its own vector env with ``factory(num_envs=n)`` and the
seed the batcher gives it (:mod:`rlstruct.batchers.seeding`). The factory must pickle (a
module-level function or a ``functools.partial`` of one) to reach worker processes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from torch import Tensor

from rlstruct import keys as K
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.autoreset import autoreset_mode, refuse_stale_autoreset
from rlstruct.envs.base import StepResult, VecEnv
from rlstruct.envs.envpool_arrays import leaf_arrays
from rlstruct.envs.spaces import ActionSpec, Leaf, observation_leaves, torch_dtype, write_leaves
from rlstruct.envs.step_checks import check_observations, check_step
from rlstruct.errors import (
    BatcherStateError,
    ConfigError,
    KeyMismatchError,
    ObservationError,
    RewardError,
    RLStructError,
    ShapeError,
)

__all__ = ["VectorEnvAdapter", "VectorEnvFactory"]

_CPU = torch.device("cpu")
_SOURCE = "the vector env"

#: ``make_env(num_envs=n) -> gymnasium.vector.VectorEnv``: what builds the user's vector env.
VectorEnvFactory = Callable[..., gym.vector.VectorEnv]


class VectorEnvAdapter(VecEnv):
    """A ``gymnasium.vector.VectorEnv`` of ``N`` envs as an auto-reset VecEnv (see module doc).

    Args:
        make_env: ``make_env(num_envs=n_envs)`` returns the vector env (a module-level function
            or a ``functools.partial``, so that it pickles to batcher workers), or a gymnasium
            id, made with ``gymnasium.make_vec(make_env, num_envs=n_envs, **make_kwargs)``.
        n_envs: ``N``; the vector env must have ``num_envs == n_envs``.
        seed: passed to the vector env's first ``reset`` (gymnasium's vector envs seed sub-env
            ``k`` with ``seed + k``); seeds the single-env action space.
        make_kwargs: keyword arguments of ``gymnasium.make_vec`` (a gymnasium id only):
            ``vectorization_mode``, ``vector_kwargs={"autoreset_mode": ...}``...
        env_id_offset: global index of env 0, used in error messages (batcher workers).
        check_obs: raise :class:`~rlstruct.errors.ObservationError` when a float observation
            holds NaN or an infinity, at a step or a reset; ``False`` lets them through.

    Attributes:
        autoreset_mode: the vector env's ``gymnasium.vector.AutoresetMode``.

    Raises:
        ConfigError: ``make_env`` did not return a ``gymnasium.vector.VectorEnv``, or one with
            another ``num_envs``; bad ``n_envs``, ``seed`` or offset.
        AutoresetModeError: the vector env's auto-reset mode is missing or unknown.
        SpaceError: an observation or action space rlstruct does not carry.

    Examples:
        >>> import functools
        >>> make = functools.partial(gym.make_vec, "CartPole-v1", vectorization_mode="sync",
        ...                          vector_kwargs={"autoreset_mode": "SameStep"})
        >>> env = VectorEnvAdapter(make, n_envs=4, seed=0)
        >>> obs, running = env.reset()
        >>> obs["frame"].shape, running.tolist()
        (torch.Size([4, 4]), [0, 1, 2, 3])
        >>> env.close()
    """

    def __init__(
        self,
        make_env: VectorEnvFactory | str,
        n_envs: int = 1,
        seed: int = 0,
        *,
        make_kwargs: Mapping[str, Any] | None = None,
        env_id_offset: int = 0,
        check_obs: bool = True,
    ) -> None:
        for name, value, low in (("n_envs", n_envs, 1), ("seed", seed, 0),
                                 ("env_id_offset", env_id_offset, 0)):
            _check_int(name, value, low)
        if isinstance(make_env, str):
            make_env = functools.partial(gym.make_vec, make_env, **dict(make_kwargs or {}))
        elif make_kwargs:
            raise ConfigError("make_kwargs go with a gymnasium id; a factory takes its own")
        if not callable(make_env):
            raise ConfigError(f"make_env must be a gymnasium id or a callable, got {make_env!r}")
        n = int(n_envs)
        vec = make_env(num_envs=n)
        if not isinstance(vec, gym.vector.VectorEnv):
            if callable(getattr(vec, "close", None)):
                vec.close()
            raise ConfigError(
                f"make_env returned a {type(vec).__name__}, expected a gymnasium.vector.VectorEnv "
                "(for single gymnasium envs, use GymEnvInf)"
            )
        self._vec = vec
        self._closed = False
        try:
            if vec.num_envs != n:
                raise ConfigError(f"make_env(num_envs={n}) returned {vec.num_envs} envs")
            self.autoreset_mode = autoreset_mode(vec)
            refuse_stale_autoreset(vec, self.autoreset_mode)
            self.observation_space: gym.Space = vec.single_observation_space
            self.action_space: gym.Space = vec.single_action_space
            self._leaves: list[Leaf] = observation_leaves(self.observation_space)
            self._act = ActionSpec(self.action_space)
        except BaseException:
            self.close()
            raise
        self.action_space.seed(int(seed))
        self._n = n
        self._seed = int(seed)
        self._seeded = False
        self._offset = int(env_id_offset)
        self._obs_checked = [
            (i, lf.key) for i, lf in enumerate(self._leaves) if lf.dtype.kind == "f"
        ] if check_obs else []
        self._arange = np.arange(n)
        self._t = np.zeros(n, np.int64)
        self._running: np.ndarray | None = None

    # ------------------------------------------------------------------ public API
    def n_envs(self) -> int:
        """``N``, the number of envs (no side effect)."""
        return self._n

    @property
    def vector_env(self) -> gym.vector.VectorEnv:
        """The user's vector env (for inspection: stepping it directly desynchronises the
        VecEnv)."""
        return self._vec

    def observation_specs(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """``{key: (shape without N, dtype)}`` of every observation, known before any reset."""
        scalar = torch.Size()
        specs = {lf.key: (torch.Size(lf.shape), torch_dtype(lf.dtype)) for lf in self._leaves}
        for key, dtype in ((K.REWARD, torch.float32), (K.TERMINATED, torch.bool),
                           (K.TRUNCATED, torch.bool), (K.DONE, torch.bool),
                           (K.INITIAL_STATE, torch.bool), (K.ENV_STEP, torch.long)):
            specs[key] = (scalar, dtype)
        specs[K.LAST_ACTION] = (torch.Size(self._act.shape), self._act.torch_dtype)
        return specs

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, Tensor]:
        """Resets every env (the first reset seeds them, later ones continue their streams).

        Args:
            env_info: ``None`` or an empty DictTensor: a vector env takes one ``options`` for
                all its envs, not one per env.

        Returns:
            ``(observation (N, ...), running = arange(N))``, ``running`` an int64 CPU tensor.

        Raises:
            BatcherStateError: the env is closed.
            KeyMismatchError: ``env_info`` has keys.
            ObservationError: a float reset observation holds NaN or an infinity.
        """
        self._check_open()
        if env_info is not None and (not isinstance(env_info, DictTensor) or not env_info.empty()):
            raise KeyMismatchError(
                f"env_info {env_info!r} was given, but a gymnasium vector env takes no per-env "
                "reset options: pass env_info=None"
            )
        self._running = None
        try:
            obs, _ = self._vec.reset(seed=None if self._seeded else self._seed)
        except BaseException as e:
            _note(e, "raised by the vector env's reset(); call reset() to go on")
            raise
        self._seeded = True
        leaves = self._leaf_arrays(obs)
        self._t[:] = 0
        if self._obs_checked:
            check_observations(leaves, self._obs_checked, self._arange, self._offset, self._t,
                               True)
        out = {lf.key: torch.from_numpy(x) for lf, x in zip(self._leaves, leaves)}
        out.update(self._reset_keys(np.ones(self._n, bool)))
        self._running = self._arange.copy()
        return DictTensor.trusted(out, self._n, _CPU), torch.from_numpy(self._arange.copy())

    def step(self, action: DictTensor) -> StepResult:
        """Steps all ``N`` envs; an env that ends its episode starts the next one in
        ``obs_next``.

        Args:
            action: DictTensor with ``action`` of shape ``(N, *action_shape)`` on the CPU.

        Returns:
            ``((obs_t1, arange(N)), (obs_next, arange(N)))``: ``obs_t1`` holds the TRUE final
            observation of an ended env, ``obs_next`` the first observation of its next episode
            (``initial_state`` True, ``env_step`` 0, reward 0); ``obs_next`` shares ``obs_t1``'s
            tensors when no episode ended.

        Raises:
            BatcherStateError: no reset yet, closed, a failed step, or a vector env that did not
                honour a partial reset.
            ShapeError: ``action`` does not have ``N`` rows, or the env answered with others.
            DeviceContractError: ``action`` is not on the CPU.
            ActionError: an action is outside the action space (no env was stepped).
            SpaceError: an observation of another dtype than its space (no silent cast).
            KeyMismatchError: a ``SAME_STEP`` env gave no ``info["final_obs"]`` for an ended env.
            ObservationError: a float observation holds NaN or an infinity (``check_obs``).
        """
        self._check_open()
        run, a = check_step(self, self._running, action, self._act, self._offset)
        self._running = None  # until this step succeeds
        try:
            obs, rew, term, trunc, info = self._vec.step(a)
        except BaseException as e:
            _note(e, "raised by the vector env's step(); call reset() to go on")
            raise
        leaves = self._leaf_arrays(obs)
        reward = self._rewards(rew)
        terminated, truncated = self._flags(term, "terminated"), self._flags(trunc, "truncated")
        done = terminated | truncated
        self._t += 1
        ended = np.flatnonzero(done)
        if ended.shape[0] and self.autoreset_mode == AutoresetMode.SAME_STEP:
            final, fresh = self._final_obs(leaves, info, ended), leaves
        elif ended.shape[0]:
            final, fresh = leaves, self._partial_reset(leaves, done)
        else:
            final = fresh = leaves
        if self._obs_checked:
            check_observations(final, self._obs_checked, run, self._offset, self._t)
        t1: dict[str, Tensor] = {lf.key: torch.from_numpy(x) for lf, x in zip(self._leaves, final)}
        t1[K.REWARD] = torch.from_numpy(reward)
        t1[K.TERMINATED] = torch.from_numpy(terminated)
        t1[K.TRUNCATED] = torch.from_numpy(truncated)
        t1[K.DONE] = torch.from_numpy(done)
        t1[K.INITIAL_STATE] = torch.zeros(self._n, dtype=torch.bool)
        t1[K.LAST_ACTION] = torch.from_numpy(a)
        t1[K.ENV_STEP] = torch.from_numpy(self._t.copy())
        self._running = run
        was = torch.from_numpy(run.copy())
        nxt = self._next_obs(t1, fresh, ended, done, a) if ended.shape[0] else dict(t1)
        return (DictTensor.trusted(t1, self._n, _CPU), was), (
            DictTensor.trusted(nxt, self._n, _CPU), was.clone()
        )

    def set_env_id_offset(self, offset: int) -> None:
        """Sets the global index of env 0 (what error messages name; see
        :meth:`VecEnv.set_env_id_offset`).

        Raises:
            ConfigError: ``offset`` is not an int >= 0.
        """
        _check_int("env_id_offset", offset, 0)
        self._offset = int(offset)

    def close(self) -> None:
        """Closes the vector env (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._running = None
        self._vec.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self._vec!r}, n_envs={self._n}, seed={self._seed}, "
            f"autoreset_mode={self.autoreset_mode.name})"
        )

    # ------------------------------------------------------------------ helpers
    def _next_obs(
        self, t1: dict[str, Tensor], fresh: list[np.ndarray], ended: np.ndarray,
        done: np.ndarray, a: np.ndarray,
    ) -> dict[str, Tensor]:
        """``obs_next`` after a step where the envs ``ended`` ended their episode: ``fresh``'s
        leaves (the new episodes' first observations in those rows), the reset keys there and
        ``t1``'s reward and last action in the other rows."""
        self._t[ended] = 0
        if self._obs_checked:
            self._check_reset_rows(fresh, ended)
        nxt = {lf.key: torch.from_numpy(x) for lf, x in zip(self._leaves, fresh)}
        nxt.update(self._reset_keys(done))
        nxt[K.REWARD] = torch.where(torch.from_numpy(done), 0.0, t1[K.REWARD])
        last = a.copy()
        last[ended] = self._act.default
        nxt[K.LAST_ACTION] = torch.from_numpy(last)
        return nxt

    def _reset_keys(self, rows: np.ndarray) -> dict[str, Tensor]:
        """The keys of a reset observation beyond the leaves, for ``N`` rows: a reset one in
        each row of ``rows``, the end flags False everywhere (``obs_next`` of rows that go on
        are not done either)."""
        n = self._n
        zeros = torch.zeros(n, dtype=torch.bool)
        last = np.repeat(self._act.default[None], n, axis=0)
        return {
            K.REWARD: torch.zeros(n, dtype=torch.float32),
            K.TERMINATED: zeros,
            K.TRUNCATED: zeros.clone(),
            K.DONE: zeros.clone(),
            K.INITIAL_STATE: torch.from_numpy(rows.copy()),
            K.LAST_ACTION: torch.from_numpy(last),
            K.ENV_STEP: torch.from_numpy(self._t.copy()),
        }

    def _leaf_arrays(self, obs: Any) -> list[np.ndarray]:
        """The observation leaves of a batched observation of ``N`` rows (fresh arrays)."""
        leaves = leaf_arrays(obs, self._leaves, None, _SOURCE)
        for lf, x in zip(self._leaves, leaves):
            if x.shape[0] != self._n:
                raise ShapeError(
                    f"{_SOURCE} returned {lf.key!r} with {x.shape[0]} rows, expected {self._n} "
                    "(one per env)"
                )
        return leaves

    def _rewards(self, rew: Any) -> np.ndarray:
        x = np.asarray(rew)
        if x.shape != (self._n,) or x.dtype.kind not in "biuf":
            raise RewardError(
                f"{_SOURCE} returned rewards of shape {x.shape} and dtype {x.dtype}, expected "
                f"({self._n},) real numbers"
            )
        return x.astype(np.float32)

    def _flags(self, flags: Any, name: str) -> np.ndarray:
        x = np.asarray(flags)
        if x.shape != (self._n,) or x.dtype.kind not in "biu":
            raise ShapeError(
                f"{_SOURCE} returned {name} of shape {x.shape} and dtype {x.dtype}, expected "
                f"({self._n},) booleans"
            )
        return x.astype(bool)

    def _final_obs(
        self, leaves: list[np.ndarray], info: Any, ended: np.ndarray
    ) -> list[np.ndarray]:
        """``SAME_STEP``: ``leaves`` (reset observations in the rows ``ended``) with the TRUE
        final observations of ``info["final_obs"]`` written into those rows (fresh arrays)."""
        final = info.get("final_obs") if isinstance(info, Mapping) else None
        if isinstance(final, np.ndarray) and final.dtype == object and final.shape == (self._n,):
            rows = [np.empty((ended.shape[0], *lf.shape), lf.dtype) for lf in self._leaves]
            for j, k in enumerate(ended.tolist()):
                if final[k] is None:
                    final = None
                    break
                write_leaves(final[k], self._leaves, rows, j, self._offset + k)
        elif final is not None:  # a batched observation (a GPU simulator's)
            rows = [x[ended] for x in self._leaf_arrays(final)]
        if final is None:
            raise KeyMismatchError(
                f"envs {(ended + self._offset).tolist()} ended their episode, but the SAME_STEP "
                "vector env gave no info['final_obs'] for them (gymnasium's SAME_STEP mode "
                "puts the true final observation there)"
            )
        out = [x.copy() for x in leaves]
        for x, r in zip(out, rows):
            x[ended] = r
        return out

    def _partial_reset(self, leaves: list[np.ndarray], done: np.ndarray) -> list[np.ndarray]:
        """``NEXT_STEP``/``DISABLED``: resets the envs of ``done`` now (gymnasium's
        ``reset_mask``); returns the observation leaves, the new episodes' in those rows."""
        try:
            obs, _ = self._vec.reset(options={"reset_mask": done.copy()})
        except BaseException as e:
            _note(e, "raised by the vector env's reset(options={'reset_mask': ...}); call "
                  "reset() to go on")
            raise
        fresh = self._leaf_arrays(obs)
        keep = ~done
        for lf, before, after in zip(self._leaves, leaves, fresh):
            if not np.array_equal(before[keep], after[keep], equal_nan=lf.dtype.kind in "fc"):
                raise BatcherStateError(
                    f"{type(self._vec).__name__} changed the observation {lf.key!r} of envs it "
                    "was not asked to reset by reset(options={'reset_mask': mask}): it does not "
                    f"take gymnasium's partial reset, which its {self.autoreset_mode} mode needs "
                    "here; build it with autoreset_mode=SAME_STEP, or make its reset honour "
                    "reset_mask"
                )
        return fresh

    def _check_reset_rows(self, fresh: list[np.ndarray], ended: np.ndarray) -> None:
        try:
            check_observations([x[ended] for x in fresh], self._obs_checked, ended,
                               self._offset, self._t, True)
        except ObservationError:
            self._running = None
            raise

    def _check_open(self) -> None:
        if self._closed:
            raise BatcherStateError(f"{type(self).__name__} is closed")


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")


def _note(e: BaseException, text: str) -> None:
    if hasattr(e, "add_note") and not isinstance(e, RLStructError):  # Python >= 3.11
        e.add_note(text)

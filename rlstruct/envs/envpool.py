"""``EnvPoolEnv``: an `envpool <https://github.com/sail-sg/envpool>`_ batch as one VecEnv.

envpool steps ``N`` envs in C++ threads and returns batched numpy arrays: one call per step for
the whole batch, no Python loop over envs. This module maps it onto the VecEnv contract
(:mod:`rlstruct.envs.base`) with the keys, shapes and dtypes of
:class:`~rlstruct.envs.GymEnv`: the env's own observation leaves (``frame``, or one key per leaf
of a ``Dict`` space) in envpool's dtypes (uint8 Atari frames stay uint8; a ``Discrete`` leaf is
int64, as for ``GymEnv``, envpool's int32 ones widened exactly), ``reward`` (float32),
``terminated``, ``truncated``, ``done``, ``initial_state`` (bool), ``last_action`` (the action
space's shape and dtype; its default at reset), ``env_step`` (int64, 0 at reset) and, per name
in ``info_keys``, ``info/<name>`` (float32).

envpool is an optional dependency (``pip install -e '.[envpool]'``; 1.2.5 checked, Linux x86_64):
this module imports without it, and building an ``EnvPoolEnv`` without it raises an
``ImportError`` saying what to install.

**Synchronous mode.** The pool is built with ``batch_size = num_envs``: every ``step`` steps the
running envs and returns their rows in env order (envpool's asynchronous mode, where ``recv``
returns whichever envs finished first, does not fit a VecEnv: ``batch_size`` is refused).

**Auto-reset.** envpool resets an env on the step AFTER its episode ended: the ``step`` call
that ends an episode returns the final observation, and the NEXT call ignores that env's action
and returns its reset observation with reward 0 (gymnasium's ``AutoresetMode.NEXT_STEP``; envpool
1.2.5 checked). Used as it is, that would spend one agent step per episode on an action nothing
executes. ``EnvPoolEnv`` never leaves that step to the agent: in the ``step`` where envs end
their episode, it makes one more envpool call for exactly those envs (synchronous envpool takes
a subset of ``env_id``), so

- ``obs_t1`` holds the TRUE final observation of an ended env (with ``terminated``/``truncated``
  and the episode's last reward);
- with ``auto_reset=True``, ``obs_next`` holds the first observation of its next episode
  (``initial_state`` True, ``env_step`` 0, reward 0), and the agent's next action for that env is
  executed in the new episode: no action is dropped or credited to the wrong episode;
- with ``auto_reset=False`` (episodic, like ``GymEnv``), ended envs leave ``running``; only the
  running envs are stepped (envpool's ``step(action, env_id)``), and ``reset()`` resets all.

That extra call is envpool's own next-step reset, given the action space's default action (which
envpool ignores): ``step(default, env_id=ended)``. It is envpool's reset with envpool's rules:
with Atari's ``episodic_life=True`` an episode ends at each life lost and the game goes on
(envpool's explicit ``reset(env_id)`` would restart the game instead: checked on Breakout).
Envs that only this class truncated (see below) are reset with ``reset(env_id)``. A step in
which no episode ends is one envpool call; a step in which some end is two.

**Time limits.** envpool reports a time limit as ``truncated`` and then clears ``terminated``
(its gymnasium API sets ``terminated = done & ~truncated``), so an episode that terminates at
the very step the limit is reached would come back as truncated only, unlike gymnasium's
``TimeLimit``. ``EnvPoolEnv`` therefore applies the limit itself: it reads envpool's
``max_episode_steps`` (the task's default, or the one passed), builds the pool with one step
more, and sets ``truncated`` at the step where ``env_step`` reaches the limit, while
``terminated`` stays the env's own rule: both can be True, as with gymnasium. Other truncations
envpool reports pass through. Exception: with ``episodic_life=True`` envpool counts the limit
over the whole game, not per life, and it is left to envpool (with its convention).

**Seeds.** ``envpool.make(..., seed=s)`` seeds env ``k`` of the pool with ``s + k`` (envpool's
own rule: checked against a pool of one env built with ``seed=s + k``), which is rlstruct's
rule, so ``EnvPoolEnv(..., seed=s)`` passes ``s`` on; ``seed + n_envs - 1`` must fit an int32.
(envpool 1.2.5 also takes one seed per env, ``seed=[s, s + 1, ...]``: the same envs, checked.)
Later resets continue each env's own random stream. envpool's initial states are drawn by its
own C++ generators: they differ from gymnasium's for the same seed. The action space is seeded
with ``seed``.

**Threads.** envpool's ``num_threads`` defaults to 0: envpool sizes its thread pool from the
machine's cores. Inside ``Batcher`` workers that share few cores, pass ``num_threads=1`` (an
envpool keyword): each worker then keeps to one core.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import StepResult, VecEnv
from rlstruct.envs.envpool_args import INSTALL_HINT as INSTALL_HINT
from rlstruct.envs.envpool_args import check_arguments, check_int, check_task_id, import_envpool
from rlstruct.envs.envpool_arrays import env_order, info_arrays, leaf_arrays, take
from rlstruct.envs.spaces import ActionSpec, Leaf, observation_leaves, torch_dtype
from rlstruct.envs.step_checks import check_observations, check_step
from rlstruct.errors import (
    BatcherStateError,
    ConfigError,
    KeyMismatchError,
    ObservationError,
    RLStructError,
)

__all__ = ["EnvPoolEnv", "import_envpool"]

_CPU = torch.device("cpu")
_INFO = "info/"


class EnvPoolEnv(VecEnv):
    """``N`` envs of one envpool task, stepped by envpool in one call per step (see module doc).

    Args:
        env: an envpool task id (``envpool.list_all_envs()``: ``"CartPole-v1"``,
            ``"Pong-v5"``...).
        n_envs: ``N``.
        seed: env ``k`` is seeded ``seed + k`` (envpool's rule); ``seed + n_envs - 1`` must fit
            an int32.
        auto_reset: ``True``: all ``N`` envs run forever, like ``GymEnvInf``; ``False``:
            episodic, like ``GymEnv``.
        info_keys: names of per-env numeric entries of envpool's ``info`` (e.g. ``"lives"`` for
            Atari) recorded as float32 ``info/<name>`` keys (0 where absent).
        env_id_offset: global index of env 0, used in error messages (batcher workers).
        check_obs: raise :class:`~rlstruct.errors.ObservationError` (naming env, key and
            env_step) when a float observation holds NaN or an infinity, at a step or a reset,
            before any agent sees it (one ``np.isfinite`` pass per float key); ``False`` lets
            them through.
        **envpool_kwargs: passed to ``envpool.make`` (``num_threads``, ``max_episode_steps``,
            Atari's ``episodic_life``, ``reward_clip``, ``repeat_action_probability``...).
            ``num_envs``, ``batch_size``, ``seed``, ``env_seed`` and ``env_type`` are set by
            this class and refused here.

    Raises:
        ImportError: envpool is not installed (``pip install -e '.[envpool]'``).
        ConfigError: an unknown task id, a bad ``n_envs``, ``seed``, ``max_episode_steps`` or
            offset, or a keyword this class sets itself.
        SpaceError: an observation or action space rlstruct does not carry.

    Example (needs envpool)::

        env = EnvPoolEnv("CartPole-v1", n_envs=64, seed=0)
        obs, running = env.reset()                    # obs["frame"]: (64, 4) float32
        action = DictTensor({"action": torch.zeros(64, dtype=torch.long)})
        (obs_t1, _), (obs_next, running) = env.step(action)

        pong = EnvPoolEnv("Pong-v5", n_envs=16, seed=0, num_threads=1)  # (16, 4, 84, 84) uint8
    """

    def __init__(
        self,
        env: str,
        n_envs: int,
        seed: int = 0,
        *,
        auto_reset: bool = True,
        info_keys: Sequence[str] = (),
        env_id_offset: int = 0,
        check_obs: bool = True,
        **envpool_kwargs: Any,
    ) -> None:
        check_arguments(n_envs, seed, env_id_offset, info_keys, envpool_kwargs)
        envpool = import_envpool()
        check_task_id(envpool, env)
        kwargs = dict(envpool_kwargs)
        if kwargs.get("max_episode_steps") is not None:
            check_int("max_episode_steps", kwargs["max_episode_steps"], 1)
        n = int(n_envs)
        limit, own_limit = self._open_pool(envpool, env, n, int(seed), kwargs)
        self.action_space.seed(int(seed))
        self.env_id = env
        self.max_episode_steps: int | None = limit or None
        self.auto_reset = bool(auto_reset)
        self._limit = limit if own_limit else 0
        self._n = n
        self._seed = int(seed)
        self._offset = int(env_id_offset)
        self._obs_checked = [
            (i, lf.key) for i, lf in enumerate(self._leaves) if lf.dtype.kind == "f"
        ] if check_obs else []
        self._info_keys = tuple(info_keys)
        self._closed = False
        self._arange = np.arange(n)
        self._t = np.zeros(n, np.int64)
        self._running: np.ndarray | None = None
        # The fixed parts of a reset observation (leaves and info come from envpool).
        self._reset_const: dict[str, np.ndarray] = {
            K.REWARD: np.zeros(n, np.float32),
            K.TERMINATED: np.zeros(n, bool),
            K.TRUNCATED: np.zeros(n, bool),
            K.DONE: np.zeros(n, bool),
            K.INITIAL_STATE: np.ones(n, bool),
            K.LAST_ACTION: np.repeat(self._act.default[None], n, axis=0),
            K.ENV_STEP: np.zeros(n, np.int64),
        }

    def _open_pool(
        self, envpool: Any, env: str, n: int, seed: int, kwargs: dict[str, Any]
    ) -> tuple[int, bool]:
        """Makes the envpool of ``n`` envs and reads its spaces; ``(limit, own_limit)``: the
        task's ``max_episode_steps`` (0: none) and whether this class enforces it."""
        with warnings.catch_warnings():
            # gymnasium warns that envpool's float64 Box bounds are cast to float32.
            warnings.filterwarnings("ignore", message=".*precision lowered")
            try:
                spec = envpool.make_spec(env, num_envs=n, **kwargs)
            except Exception as e:
                raise ConfigError(f"envpool refused the keywords {sorted(kwargs)}: {e}") from e
            limit = int(getattr(spec.config, "max_episode_steps", 0) or 0)
            own_limit = limit > 0 and not getattr(spec.config, "episodic_life", False)
            if own_limit:
                # envpool truncates one step later than we do: never before this class.
                kwargs["max_episode_steps"] = limit + 1
            self._pool: Any = envpool.make(
                env, env_type="gymnasium", num_envs=n, batch_size=n, seed=seed, **kwargs
            )
            try:
                self.observation_space: gym.Space = self._pool.observation_space
                self.action_space: gym.Space = self._pool.action_space
                self._leaves: list[Leaf] = observation_leaves(self.observation_space)
                self._act = ActionSpec(self.action_space)
            except BaseException:
                self._pool.close()
                raise
        return limit, own_limit

    # ------------------------------------------------------------------ public API
    def n_envs(self) -> int:
        """``N``, the number of envs (no side effect)."""
        return self._n

    @property
    def seed(self) -> int:
        """The seed: env ``k`` is seeded ``seed + k``."""
        return self._seed

    @property
    def pool(self) -> Any:
        """The envpool object (for inspection: stepping it directly desynchronises the VecEnv)."""
        return self._pool

    def observation_specs(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """``{key: (shape without N, dtype)}`` of every observation, known before any reset."""
        scalar = torch.Size()
        specs = {lf.key: (torch.Size(lf.shape), torch_dtype(lf.dtype)) for lf in self._leaves}
        specs.update(
            {
                K.REWARD: (scalar, torch.float32),
                K.TERMINATED: (scalar, torch.bool),
                K.TRUNCATED: (scalar, torch.bool),
                K.DONE: (scalar, torch.bool),
                K.INITIAL_STATE: (scalar, torch.bool),
                K.LAST_ACTION: (torch.Size(self._act.shape), self._act.torch_dtype),
                K.ENV_STEP: (scalar, torch.long),
            }
        )
        specs.update({_INFO + name: (scalar, torch.float32) for name in self._info_keys})
        return specs

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, Tensor]:
        """Resets every env (each continues its own random stream).

        Args:
            env_info: ``None`` or an empty DictTensor: envpool envs take no reset options.

        Returns:
            ``(observation (N, ...), running = arange(N))``, ``running`` an int64 CPU tensor.

        Raises:
            BatcherStateError: the env is closed.
            KeyMismatchError: ``env_info`` has keys.
            ObservationError: a float reset observation holds NaN or an infinity
                (``check_obs``).
        """
        self._check_open()
        if env_info is not None:
            if not isinstance(env_info, DictTensor):
                raise TypeError(
                    f"env_info must be a DictTensor or None, got {type(env_info).__name__}"
                )
            if not env_info.empty():
                raise KeyMismatchError(
                    f"env_info has keys {sorted(env_info.keys())}, but envpool envs take no "
                    "reset options: pass env_info=None"
                )
        self._running = None
        ids = self._arange
        try:
            obs, info = self._pool.reset(ids.astype(np.int32))
        except BaseException as e:
            _note(e, f"raised by envpool's reset() of {self.env_id}; call reset() to go on")
            raise
        perm = env_order(info, ids, self._n)
        self._t[:] = 0
        leaves = leaf_arrays(obs, self._leaves, perm)
        if self._obs_checked:
            check_observations(leaves, self._obs_checked, ids, self._offset, self._t, True)
        out = {lf.key: torch.from_numpy(x) for lf, x in zip(self._leaves, leaves)}
        out.update({key: torch.from_numpy(a.copy()) for key, a in self._reset_const.items()})
        for name, x in zip(self._info_keys, info_arrays(info, self._info_keys, perm, self._n)):
            out[_INFO + name] = torch.from_numpy(x)
        self._running = ids.copy()
        return DictTensor.trusted(out, self._n, _CPU), torch.from_numpy(ids.copy())

    def step(self, action: DictTensor) -> StepResult:
        """Steps the running envs (all ``N`` with ``auto_reset``), resetting those that end when
        ``auto_reset`` is set.

        Args:
            action: DictTensor with ``action`` of shape ``(n_running, *action_shape)`` on the
                CPU, rows in the order of ``running``.

        Returns:
            ``((obs_t1, was_running), (obs_next, still_running))``: ``obs_t1`` answers the
            action (TRUE final observation at an episode end); with ``auto_reset``,
            ``obs_next`` has all ``N`` rows, the reset observation in those whose episode ended
            (it shares ``obs_t1``'s tensors when none ended); episodic, it holds the rows of the
            envs still running. Running indices are int64 CPU tensors.

        Raises:
            BatcherStateError: no reset yet, closed, a failed step, or no env running.
            ShapeError: ``action`` does not have one row per running env.
            DeviceContractError: ``action`` is not on the CPU.
            ActionError: an action is outside the action space (no env was stepped).
            SpaceError: envpool returned an observation of another dtype or shape than its
                space (no silent cast).
            ObservationError: a float observation holds NaN or an infinity (``check_obs``).
        """
        run, a = self._begin_step(action)
        n = run.shape[0]
        full = n == self._n
        try:
            obs, rew, term, trunc, info = self._pool.step(a, None if full else run.astype(np.int32))
            perm = env_order(info, run, self._n)
            leaves = leaf_arrays(obs, self._leaves, perm)
            infos = info_arrays(info, self._info_keys, perm, n)
            reward = take(np.asarray(rew), perm).astype(np.float32)
            terminated = take(np.array(term, dtype=bool), perm)
            truncated = take(np.array(trunc, dtype=bool), perm)
        except BaseException as e:
            self._running = None
            if not isinstance(e, RLStructError):
                _note(e, f"raised by envpool's step() of {self.env_id}; call reset() to go on")
            raise
        self._t[run] += 1
        if self._obs_checked:
            try:
                check_observations(leaves, self._obs_checked, run, self._offset, self._t)
            except ObservationError:
                self._running = None
                raise
        t = self._t[run]
        pool_done = terminated | truncated  # the envs envpool will reset at their next step
        if self._limit:
            truncated = truncated | (t >= self._limit)
        done = terminated | truncated
        t1: dict[str, Tensor] = {lf.key: torch.from_numpy(x) for lf, x in zip(self._leaves, leaves)}
        t1[K.REWARD] = torch.from_numpy(reward)
        t1[K.TERMINATED] = torch.from_numpy(terminated)
        t1[K.TRUNCATED] = torch.from_numpy(truncated)
        t1[K.DONE] = torch.from_numpy(done)
        t1[K.INITIAL_STATE] = torch.zeros(n, dtype=torch.bool)
        t1[K.LAST_ACTION] = torch.from_numpy(a)
        t1[K.ENV_STEP] = torch.from_numpy(t)
        for name, x in zip(self._info_keys, infos):
            t1[_INFO + name] = torch.from_numpy(x)
        obs_t1 = DictTensor.trusted(t1, n, _CPU)
        was = torch.from_numpy(run.copy())
        if not done.any():
            return (obs_t1, was), (DictTensor.trusted(dict(t1), n, _CPU), was.clone())
        if self.auto_reset:
            nxt = self._reset_rows(t1, done, pool_done)
            return (obs_t1, was), (DictTensor.trusted(nxt, n, _CPU), was.clone())
        keep = ~done
        still = run[keep]
        self._running = still
        return (obs_t1, was), (obs_t1.index(torch.from_numpy(keep)), torch.from_numpy(still.copy()))

    def close(self) -> None:
        """Releases the envpool batch (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._running = None
        pool, self._pool = self._pool, None
        pool.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.env_id!r}, n_envs={self._n}, seed={self._seed}, "
            f"auto_reset={self.auto_reset}, observation_space={self.observation_space}, "
            f"action_space={self.action_space})"
        )

    # ------------------------------------------------------------------ helpers
    def _reset_rows(
        self, t1: Mapping[str, Tensor], done: np.ndarray, pool_done: np.ndarray
    ) -> dict[str, Tensor]:
        """Starts the next episode of the envs whose episode ended (``done``, all ``N`` rows);
        returns ``obs_next``: ``t1``'s rows, with the first observation of the new episode in the
        ended ones.

        Envs that envpool itself ended (``pool_done``) get envpool's next-step reset (a step
        with the default action, which envpool ignores); envs that only this class's time limit
        ended get ``reset(env_id)``.
        """
        ended = np.flatnonzero(done)
        fresh: dict[str, np.ndarray] = {}
        calls = (
            (ended[pool_done[ended]], self._pool_autoreset),
            (ended[~pool_done[ended]], self._pool_reset),
        )
        try:
            for ids, call in calls:
                if ids.shape[0] == 0:
                    continue
                obs, info = call(ids)
                perm = env_order(info, ids, self._n)
                leaves = leaf_arrays(obs, self._leaves, perm)
                if self._obs_checked:
                    check_observations(leaves, self._obs_checked, ids, self._offset, self._t, True)
                arrays = leaves + info_arrays(info, self._info_keys, perm, len(ids))
                keys = [lf.key for lf in self._leaves] + [_INFO + k for k in self._info_keys]
                for key, x in zip(keys, arrays):
                    if key not in fresh:
                        fresh[key] = np.empty((self._n, *x.shape[1:]), x.dtype)
                    fresh[key][ids] = x
        except BaseException as e:
            self._running = None
            if not isinstance(e, RLStructError):
                _note(e, f"raised by envpool while resetting {self.env_id}; call reset() to go on")
            raise
        self._t[ended] = 0
        nxt = {}
        for key, v in t1.items():
            x = v.numpy().copy()
            x[ended] = fresh[key][ended] if key in fresh else self._reset_const[key][ended]
            nxt[key] = torch.from_numpy(x)
        return nxt

    def _pool_autoreset(self, ids: np.ndarray) -> tuple[Any, Mapping[str, Any]]:
        """envpool's next-step reset of envs ``ids`` (done in envpool): ``(obs, info)``."""
        default = np.repeat(self._act.default[None], ids.shape[0], axis=0)
        obs, _, term, trunc, info = self._pool.step(default, ids.astype(np.int32))
        if np.any(term) or np.any(trunc):  # the reset step of a done env never ends
            raise BatcherStateError(
                f"envpool stepped envs {ids.tolist()} instead of resetting them (an envpool "
                "auto-reset behaviour this class does not know); call reset() to go on"
            )
        return obs, info

    def _pool_reset(self, ids: np.ndarray) -> tuple[Any, Mapping[str, Any]]:
        """envpool's explicit reset of envs ``ids``: ``(obs, info)``."""
        return self._pool.reset(ids.astype(np.int32))

    def set_env_id_offset(self, offset: int) -> None:
        """Sets the global index of env 0 (what error messages name; see
        :meth:`VecEnv.set_env_id_offset`).

        Raises:
            ConfigError: ``offset`` is not an int >= 0.
        """
        check_int("env_id_offset", offset, 0)
        self._offset = int(offset)

    def _begin_step(self, action: DictTensor) -> tuple[np.ndarray, np.ndarray]:
        """Checks call order and actions; returns ``(running, actions as numpy)``."""
        self._check_open()
        return check_step(self, self._running, action, self._act, self._offset)

    def _check_open(self) -> None:
        if self._closed:
            raise BatcherStateError(f"{type(self).__name__} is closed")


def _note(e: BaseException, text: str) -> None:
    if hasattr(e, "add_note"):  # Python >= 3.11
        e.add_note(text)

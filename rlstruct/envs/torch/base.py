"""``TorchVecEnv``: ``N`` environments whose state is one tensor ``(N, d)`` on a device.

The dynamics of all ``N`` envs are one batched tensor computation, so the envs run where the
agent and the batcher's buffer run (a GPU included) and a step costs a few dozen tensor ops
whatever ``N``: no Python loop over envs, no copy to or from the host.

A subclass declares its spaces and sizes and writes three pure functions (see
:class:`TorchVecEnv`); the base class does the rest of the VecEnv contract
(:mod:`rlstruct.envs.base`): reset, episode step limits, auto-reset, action checks, seeding and
the observation keys of :class:`~rlstruct.envs.GymEnv`.

Observations: the env's ``frame`` (the observation space's dtype, float32 for the classic
control envs, whatever the state dtype) plus ``reward`` (float32), ``terminated``,
``truncated``, ``done``, ``initial_state`` (bool), ``last_action`` (the action space's dtype and
shape, its default at reset: 0 clipped into the space) and ``env_step`` (int64, 0 at reset):
the keys, shapes and dtypes a ``GymEnv`` gives for the gymnasium env. Every tensor lives on the
env's ``device``, running indices included (int64). Returned tensors never alias the env's state
nor the caller's action.

Flavours (``auto_reset``):

- ``auto_reset=False`` (like ``GymEnv``): an env whose episode ends leaves ``running``; ``step``
  takes one action row per running env; once all have ended, ``reset`` starts new episodes.
  Shrinking ``running`` reads the ``done`` flags on the host: one device synchronisation per
  step on a GPU.
- ``auto_reset=True`` (like ``GymEnvInf``): all ``N`` envs run forever. At an episode end,
  ``obs_t1`` keeps the TRUE final observation (with ``terminated``/``truncated``) and
  ``obs_next`` holds the first observation of the next episode, drawn inside the same ``step``.
  On a non-CPU device this path has no host synchronisation (the reset is a masked
  ``torch.where`` over all rows); on the CPU only the rows that ended are redrawn. Both give the
  same numbers.

Episode ends: ``terminated`` is the env's own rule; ``truncated`` is gymnasium's ``TimeLimit``:
true at the step where ``env_step`` reaches ``max_episode_steps`` (the gymnasium spec's value by
default), whether or not the env also terminated. ``done`` is their OR.

Random initial states: env ``k`` of an env built with ``seed=s`` draws them from its OWN
counter-based stream (SplitMix64 seeded with ``mix64(s + k)``), on the env's device, never from
torch's generators: the exact rule, and why, is in :mod:`rlstruct.envs.torch.streams`.

Checks: ``step`` checks the action's key, row count (:class:`ShapeError`), device
(:class:`DeviceContractError`), per-env shape and dtype (:class:`ActionError`) from metadata
only, and its values against the action space (range, and finiteness for ``Box`` spaces) with
one vectorised reduction; a bad action raises :class:`ActionError` naming the first bad env
(``exc.env_index``, its local index) before any env is stepped. On a GPU that range check reads
one flag on the host per step; ``check_actions=False`` drops it (out-of-range actions are then
clipped or mapped by the dynamics, never an error). Observations are checked after the dynamics
(``check_obs``): a NaN or an infinity in a float observation, at a step or in a reset
observation, raises :class:`ObservationError` naming the first bad env; one reduction per step,
and on a GPU one more flag read on the host (``check_obs=False`` drops it).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import ClassVar

import gymnasium as gym
import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import StepResult, VecEnv
from rlstruct.envs.step_checks import check_running, observation_error
from rlstruct.envs.torch.actions import TorchActions, torch_dtype_of
from rlstruct.envs.torch.arguments import (
    check_int,
    check_state,
    default_options,
    parse_options,
    usable_device,
)
from rlstruct.envs.torch.streams import mix64, splitmix64_uniform, stream_step
from rlstruct.errors import (
    BatcherStateError,
    ConfigError,
    ObservationError,
)

__all__ = ["TorchVecEnv", "splitmix64_uniform", "mix64"]


class TorchVecEnv(VecEnv):
    """Base of VecEnvs whose ``N`` states form one tensor ``(N, d)`` on ``device``.

    A subclass sets the class attributes below and writes three pure, batched functions (they
    never read nor write the env's own state, so they may also be called directly, e.g. by a
    hand-written loop or a planner):

    - ``initial_state(u, options) -> (n, d)``: initial states from ``u`` ``(n, n_draws)``,
      uniforms in ``[0, 1)`` of the state dtype, and ``options`` (``{name: (n,)}``, the reset
      options of these rows, see ``reset_options``);
    - ``dynamics(state, action) -> (next_state (n, d), reward (n,), terminated (n,) bool)``,
      ``action`` ``(n, *action_shape)`` in the action space's dtype; must not modify ``state``;
    - ``observe(state) -> (n, *obs_shape)``: the observation, a NEW tensor (never a view of
      ``state``) in the observation space's dtype.

    Class attributes:

    - ``observation_space``, ``action_space``: single-env gymnasium spaces (a ``Box`` for
      observations; ``Discrete`` or ``Box`` actions); each env gets its own copy.
    - ``state_size``: ``d``. ``n_draws``: uniforms drawn per reset (``D``).
    - ``default_max_episode_steps``: the time limit when the constructor gets ``None``.
    - ``reset_options``: ``{name: default}``, the ``env_info`` keys that ``reset`` accepts (one
      value per env, used by that env's resets until the next ``reset``; the defaults
      otherwise), gymnasium's ``reset(options=...)`` names.

    Args:
        n_envs: ``N``.
        seed: env ``k`` draws its initial states from the stream of ``seed + k`` (see
            :mod:`rlstruct.envs.torch.streams` for the exact rule).
        device: where the state, the observations and the running indices live; actions must
            be given there.
        dtype: the floating dtype of the state and of the dynamics (observations keep the
            observation space's dtype): float32 for speed, float64 to match gymnasium's
            float64 state.
        max_episode_steps: ``truncated`` is set at the step where ``env_step`` reaches it
            (``None``: ``default_max_episode_steps``).
        auto_reset: ``False``: episodic (``GymEnv``-like); ``True``: every env restarts inside
            ``step`` (``GymEnvInf``-like).
        check_actions: check each action's value against the action space (a host
            synchronisation per step on a GPU); shape, dtype and device are always checked.
        env_id_offset: global index of env 0, used in error messages (batcher workers).
        check_obs: raise :class:`~rlstruct.errors.ObservationError` (naming env, key and
            env_step) when a float observation holds NaN or an infinity (a subclass's dynamics
            or ``observe`` gone wrong, a state set by hand), at a step or a reset, before any
            agent sees it: one ``isfinite`` reduction per step, and on a GPU one more host
            synchronisation per step (like ``check_actions``); ``False`` drops it.

    Raises:
        ConfigError: a bad ``n_envs``, ``seed``, ``device``, ``dtype``, ``max_episode_steps`` or
            ``env_id_offset``.
    """

    observation_space: gym.Space
    action_space: gym.Space
    state_size: ClassVar[int]
    n_draws: ClassVar[int]
    default_max_episode_steps: ClassVar[int]
    reset_options: ClassVar[Mapping[str, float]] = {}

    def __init__(
        self,
        n_envs: int = 1,
        seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        max_episode_steps: int | None = None,
        *,
        auto_reset: bool = False,
        check_actions: bool = True,
        env_id_offset: int = 0,
        check_obs: bool = True,
    ) -> None:
        check_int("n_envs", n_envs, 1)
        check_int("seed", seed, 0)
        check_int("env_id_offset", env_id_offset, 0)
        if max_episode_steps is None:
            max_episode_steps = self.default_max_episode_steps
        check_int("max_episode_steps", max_episode_steps, 1)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ConfigError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self._device = usable_device(device)
        self._dtype = dtype
        self._n = int(n_envs)
        self._seed = int(seed)
        self._offset = int(env_id_offset)
        self.max_episode_steps = int(max_episode_steps)
        self.auto_reset = bool(auto_reset)
        self.check_actions = bool(check_actions)
        self.check_obs = bool(check_obs)

        self.observation_space = copy.deepcopy(type(self).observation_space)
        self.action_space = copy.deepcopy(type(self).action_space)
        self.action_space.seed(self._seed)
        self._act = TorchActions(self.action_space, self._device, type(self).__name__)
        self._obs_shape = tuple(self.observation_space.shape)
        self._obs_dtype = torch_dtype_of(self.observation_space.dtype)

        dev, n = self._device, self._n
        self._arange = torch.arange(n, device=dev)
        # The SplitMix64 state of env k's stream: mix64(seed + k), advanced by n_draws outputs
        # per reset of env k.
        self._rng = mix64(self._seed + self._arange)
        self._rng_advance = stream_step(self.n_draws)
        self._state = torch.zeros(n, self.state_size, dtype=dtype, device=dev)
        self._t = torch.zeros(n, dtype=torch.long, device=dev)
        self._options = self._default_options()
        self._running: Tensor | None = None  # None before reset
        self._closed = False
        # Auto-reset without reading ``done`` on the host (masked over all rows): off the CPU.
        self._sync_free = dev.type != "cpu"

    # ------------------------------------------------------------------ subclass hooks
    def initial_state(self, u: Tensor, options: Mapping[str, Tensor]) -> Tensor:
        """Initial states ``(n, d)`` from uniforms ``u`` ``(n, n_draws)`` and reset options."""
        raise NotImplementedError

    def dynamics(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One step of ``n`` envs: ``(next_state (n, d), reward (n,), terminated (n,))``."""
        raise NotImplementedError

    def observe(self, state: Tensor) -> Tensor:
        """The observations ``(n, *obs_shape)`` of states ``(n, d)`` (a new tensor)."""
        raise NotImplementedError

    def check_options(self, options: Mapping[str, Tensor]) -> None:
        """Raises :class:`ConfigError` for bad reset options ``{name: (N,)}`` (default: none)."""

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        """The device of the state, of every returned tensor, and of the actions ``step`` takes."""
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the state and of the dynamics."""
        return self._dtype

    @property
    def seed(self) -> int:
        """The seed: env ``k`` draws from the stream of ``seed + k``."""
        return self._seed

    @property
    def state(self) -> Tensor:
        """The live state ``(N, d)``, in gymnasium's own state layout (``env.unwrapped.state``).

        The same tensor for the env's whole life, updated in place by ``step`` and ``reset``:
        writing into it (``env.state[k] = s``) sets env ``k``'s state; so does assigning a
        whole ``(N, d)`` tensor of the env's dtype and device (``env.state = s``, copied).
        Neither changes ``env_step`` nor which envs are running.
        """
        return self._state

    @state.setter
    def state(self, value: Tensor) -> None:
        check_state(value, self._state)
        self._state.copy_(value)

    def n_envs(self) -> int:
        """``N``, the number of envs (no side effect)."""
        return self._n

    def observation_specs(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """``{key: (shape without N, dtype)}`` of every observation, known before any reset."""
        scalar = torch.Size()
        return {
            K.FRAME: (torch.Size(self._obs_shape), self._obs_dtype),
            K.REWARD: (scalar, torch.float32),
            K.TERMINATED: (scalar, torch.bool),
            K.TRUNCATED: (scalar, torch.bool),
            K.DONE: (scalar, torch.bool),
            K.INITIAL_STATE: (scalar, torch.bool),
            K.LAST_ACTION: (torch.Size(self._act.shape), self._act.dtype),
            K.ENV_STEP: (scalar, torch.long),
        }

    # ------------------------------------------------------------------ reset
    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, Tensor]:
        """Resets every env (each continues its own random stream).

        Args:
            env_info: ``None`` (default reset options) or a DictTensor ``(N,)`` of reset
                options named in ``reset_options`` (on any device); they hold for every reset
                of the env, auto-resets included, until the next ``reset``.

        Returns:
            ``(observation (N, ...), running = arange(N))`` on the env's device.

        Raises:
            BatcherStateError: the env is closed.
            ShapeError: ``env_info`` does not have ``N`` rows, or a key is not ``(N,)``.
            KeyMismatchError: ``env_info`` has a key that is not a reset option.
            ConfigError: option values the env refuses (e.g. ``low > high``).
            ObservationError: a float reset observation holds NaN or an infinity (``check_obs``).
        """
        self._check_open()
        self._options = self._parse_options(env_info)
        self._running = None
        self._state.copy_(self._draw(self._arange))
        self._t.zero_()
        n, dev = self._n, self._device
        frame = self.observe(self._state)
        if self._checks_frames() and not bool(torch.isfinite(frame).all()):
            raise self._frame_error(frame, self._arange, self._t, reset=True)
        self._running = self._arange.clone()
        obs = {
            K.FRAME: frame,
            K.REWARD: torch.zeros(n, dtype=torch.float32, device=dev),
            K.TERMINATED: torch.zeros(n, dtype=torch.bool, device=dev),
            K.TRUNCATED: torch.zeros(n, dtype=torch.bool, device=dev),
            K.DONE: torch.zeros(n, dtype=torch.bool, device=dev),
            K.INITIAL_STATE: torch.ones(n, dtype=torch.bool, device=dev),
            K.LAST_ACTION: self._act.default.expand(n, *self._act.shape).clone(),
            K.ENV_STEP: torch.zeros(n, dtype=torch.long, device=dev),
        }
        return DictTensor.trusted(obs, n, dev), self._arange.clone()

    def _draw(self, rows: Tensor) -> Tensor:
        """The next initial states ``(len(rows), d)`` of envs ``rows`` (advances their streams)."""
        state = self._rng[rows]
        u = splitmix64_uniform(state, self.n_draws, self._dtype)
        self._rng[rows] = state + self._rng_advance
        options = {name: v[rows] for name, v in self._options.items()}
        return self.initial_state(u, options)

    def _draw_masked(self, mask: Tensor) -> Tensor:
        """Initial states ``(N, d)`` for every env, advancing only the streams of ``mask``'s envs
        (no host synchronisation)."""
        u = splitmix64_uniform(self._rng, self.n_draws, self._dtype)
        self._rng += mask * self._rng_advance
        return self.initial_state(u, self._options)

    def _default_options(self) -> dict[str, Tensor]:
        return default_options(self.reset_options, self._n, self._dtype, self._device)

    def _parse_options(self, env_info: DictTensor | None) -> dict[str, Tensor]:
        options = parse_options(env_info, self._default_options(), self._n, self._device,
                                self._dtype, type(self).__name__)
        if env_info is not None and not env_info.empty():
            self.check_options(options)
        return options

    # ------------------------------------------------------------------ step
    def step(self, action: DictTensor) -> StepResult:
        """Steps the running envs (all ``N`` with ``auto_reset``).

        Args:
            action: DictTensor with ``action`` of shape ``(n_running, *action_shape)`` on the
                env's device, rows in the order of ``running``.

        Returns:
            ``((obs_t1, was_running), (obs_next, still_running))`` (see the module doc);
            ``obs_next`` shares ``obs_t1``'s tensors when no env ended (CPU).

        Raises:
            BatcherStateError: no reset yet, closed, or no env running.
            ShapeError: ``action`` does not have one row per running env.
            DeviceContractError: ``action`` is on another device than the env.
            ActionError: a wrong per-env shape or dtype, or a value outside the action space
                (no env was stepped).
            ObservationError: a float observation holds NaN or an infinity (``check_obs``).
        """
        run = self._begin_step()
        n = run.shape[0]
        a = self._act.check(action, run, self.check_actions, self._offset)
        full = n == self._n
        if full:
            nxt, reward, terminated = self.dynamics(self._state, a)
            t = self._t + 1
        else:
            nxt, reward, terminated = self.dynamics(self._state[run], a)
            t = self._t[run] + 1
        truncated = t >= self.max_episode_steps
        done = terminated | truncated
        dev = self._device
        # One allocation for the all-false flags of this step (disjoint views): obs_t1's
        # initial_state, obs_next's terminated, truncated and done.
        false = torch.zeros(4, n, dtype=torch.bool, device=dev).unbind(0)
        obs_t1 = {
            K.FRAME: self.observe(nxt),
            K.REWARD: reward.to(torch.float32),
            K.TERMINATED: terminated,
            K.TRUNCATED: truncated,
            K.DONE: done,
            K.INITIAL_STATE: false[0],
            K.LAST_ACTION: a,
            K.ENV_STEP: t,
        }
        check = self._checks_frames()
        if self.auto_reset:
            ok_t1 = torch.isfinite(obs_t1[K.FRAME]).all() if check else None
            obs_next = self._auto_reset(nxt, t, obs_t1, false[1:])
            if check:
                frame = obs_next[K.FRAME]
                ok = ok_t1 if frame is obs_t1[K.FRAME] else ok_t1 & torch.isfinite(frame).all()
                if not bool(ok):  # one host read per step
                    self._running = None
                    if not bool(ok_t1):
                        raise self._frame_error(obs_t1[K.FRAME], run, t)
                    raise self._frame_error(frame, run, obs_next[K.ENV_STEP], reset=True)
            # Fresh index tensors: a caller may modify them in place.
            return (DictTensor.trusted(obs_t1, n, dev), run.clone()), (
                DictTensor.trusted(obs_next, n, dev),
                run.clone(),
            )
        if check and not bool(torch.isfinite(obs_t1[K.FRAME]).all()):
            self._running = None
            raise self._frame_error(obs_t1[K.FRAME], run, t)
        # Episodic: ended envs keep their final state and leave ``running``.
        if full:
            self._state.copy_(nxt)
            self._t.copy_(t)
        else:
            self._state[run] = nxt
            self._t[run] = t
        t1 = DictTensor.trusted(obs_t1, n, dev)
        if not bool(done.any()):
            return (t1, run.clone()), (DictTensor.trusted(dict(obs_t1), n, dev), run.clone())
        keep = ~done
        still = run[keep]
        self._running = still
        return (t1, run.clone()), (t1.index(keep), still.clone())

    def _auto_reset(
        self, nxt: Tensor, t: Tensor, obs_t1: dict[str, Tensor], false: tuple[Tensor, ...]
    ) -> dict[str, Tensor]:
        """Stores the stepped states, redraws those of the envs that ended; returns ``obs_next``
        (``false``: three all-false ``(N,)`` tensors for its flags)."""
        done = obs_t1[K.DONE]
        n = self._n
        if self._sync_free:
            init = self._draw_masked(done)
            self._state.copy_(torch.where(done[:, None], init, nxt))
            frame = self.observe(self._state)
        else:
            ended = done.nonzero().squeeze(1)
            self._state.copy_(nxt)
            if ended.shape[0] == 0:
                self._t.copy_(t)
                return dict(obs_t1)
            init = self._draw(ended)
            self._state[ended] = init
            frame = obs_t1[K.FRAME].index_put((ended,), self.observe(init))
        t_next = t.masked_fill(done, 0)
        self._t.copy_(t_next)
        a = obs_t1[K.LAST_ACTION]
        mask = done.view(n, *([1] * (a.dim() - 1)))
        return {
            K.FRAME: frame,
            K.REWARD: obs_t1[K.REWARD].masked_fill(done, 0.0),
            K.TERMINATED: false[0],
            K.TRUNCATED: false[1],
            K.DONE: false[2],
            K.INITIAL_STATE: done.clone(),
            K.LAST_ACTION: torch.where(mask, self._act.default, a),
            K.ENV_STEP: t_next,
        }

    def _checks_frames(self) -> bool:
        """Whether ``check_obs`` applies: it is set and the observations are floats."""
        return self.check_obs and self._obs_dtype.is_floating_point

    def _frame_error(
        self, frame: Tensor, rows: Tensor, env_step: Tensor, reset: bool = False
    ) -> ObservationError:
        """The :class:`ObservationError` of the first row of ``frame`` that holds NaN or an
        infinity (row ``j`` is env ``rows[j]``, at ``env_step[j]``)."""
        flat = frame.reshape(frame.shape[0], -1)
        bad = ~torch.isfinite(flat)
        j = int(bad.any(dim=1).nonzero()[0, 0])
        value = float(flat[j][bad[j]][0])
        return observation_error(
            K.FRAME, int(rows[j]), self._offset, int(env_step[j]), value, reset
        )

    def set_env_id_offset(self, offset: int) -> None:
        """Sets the global index of env 0 (what error messages name; see
        :meth:`VecEnv.set_env_id_offset`).

        Raises:
            ConfigError: ``offset`` is not an int >= 0.
        """
        check_int("env_id_offset", offset, 0)
        self._offset = int(offset)

    def _begin_step(self) -> Tensor:
        self._check_open()
        run = self._running
        check_running(type(self).__name__, run)
        return run

    # ------------------------------------------------------------------ misc
    def close(self) -> None:
        """Marks the env closed (idempotent); later ``reset``/``step`` raise."""
        self._closed = True
        self._running = None

    def _check_open(self) -> None:
        if self._closed:
            raise BatcherStateError(f"{type(self).__name__} is closed")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n_envs={self._n}, seed={self._seed}, device={self._device}, "
            f"dtype={self._dtype}, max_episode_steps={self.max_episode_steps}, "
            f"auto_reset={self.auto_reset})"
        )

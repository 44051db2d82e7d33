"""Tiny deterministic gymnasium envs for tests, tutorials and benchmarks.

``CounterEnv`` ("rlstruct/Counter-v0")
    Observation: ``Box(0, 2**62, (3,), int64)`` holding ``[env_id, episode, t]``: ``env_id`` is
    given at construction, ``episode`` counts the resets of this env (0 on the first one) and ``t``
    the steps within the episode (0 at reset, ``L`` in the final observation of an episode of
    length ``L``). Gaps, duplicates, stale or mixed-up rows are visible in any batch. Action space
    ``Discrete(n_actions)``; reward ``float(action)``; the episode ends after ``L`` steps, by
    termination (``truncate=False``) or truncation (``truncate=True``). ``L`` is an int, a list
    cycled over episodes, a callable ``(env_id, episode) -> int``, or ``options={"episode_length":
    L}`` given to ``reset`` (for that episode). Faults on demand: ``fail_at=(episode, t)`` raises
    ``RuntimeError`` in the step that would reach ``t``; ``hang_at=(episode, t)`` sleeps
    ``hang_seconds`` there. ``n_steps`` counts every step taken.

``RepeatEnv`` ("rlstruct/Repeat-v0")
    Trivially learnable: the observation is a random symbol ``s`` of ``n_symbols`` (one-hot
    ``Box(0, 1, (n_symbols,), float32)``, or ``Discrete(n_symbols)`` with ``one_hot=False``), drawn
    from the env's seeded RNG; reward 1.0 when the action equals ``s``, else 0.0. Episodes last
    ``episode_length`` steps (terminated, or truncated with ``truncate=True``). An optimal policy
    earns ``episode_length`` per episode, a uniform one ``episode_length / n_symbols``.

``MaskedChoiceEnv`` ("rlstruct/MaskedChoice-v0")
    An action-mask task: ``n_legal`` of ``n_actions`` actions are legal at each step, drawn at
    random and given as ``info["action_mask"]`` (int8 ``(A,)``, as gymnasium envs give it), or
    as the ``action_mask`` leaf of a ``Dict({"observation": Box, "action_mask":
    MultiBinary(A)})`` observation with ``dict_obs=True``. The observation ``Box(0, 1, (2,),
    float32)`` (``[t / episode_length, 1]``) says nothing of which actions are legal. A legal
    action earns 1.0; an illegal one earns ``penalty`` and terminates the episode; episodes are
    truncated after ``episode_length`` steps. A masked agent earns ``episode_length`` per
    episode from its first step; an unmasked one survives a step with probability
    ``n_legal / n_actions``, whatever it learns. ``n_illegal`` counts the illegal actions taken.
    ``"rlstruct/MaskedChoiceHidden-v0"`` is the same task with the mask withheld
    (``hide_mask=True``): what an agent faces without masks; ``"rlstruct/MaskedChoiceDict-v0"``
    gives the mask as the Dict leaf (``dict_obs=True``, sb3-contrib's layout).
``DictEnv`` ("rlstruct/Dict-v0", and "rlstruct/DictBox-v0" with Box actions)
    A Dict observation ``{"image": Box(0, 255, (3, 16, 16), uint8), "vector": Box(-1, 1, (4,),
    float32)}`` whose reward needs both keys: the image lights its left or right half, the
    vector's first entry is +1 or -1 (the others are noise), and the right action is ``side``
    when the sign is +1, ``1 - side`` when it is -1 (an XOR). Reward 1.0 for it, 0.0 else
    (``Discrete(2)``); with ``box_action`` the action is ``Box(-1, 1, (1,))`` and the reward
    ``1 - |a - target| / 2`` with ``target = 2 * right - 1``. A policy blind to either key earns
    half the optimum. Episodes last ``episode_length`` steps (terminated).

The ``make_*_env(n_envs, seed, ...)`` factories are top-level, hence picklable for worker
batchers. :func:`register_debug_envs` (called by ``import rlstruct.envs``) registers both ids
with gymnasium; it is idempotent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rlstruct.envs.gym import GymEnv, GymEnvInf
from rlstruct.errors import ConfigError

__all__ = [
    "COUNTER_ID",
    "REPEAT_ID",
    "MASKED_CHOICE_ID",
    "MASKED_CHOICE_HIDDEN_ID",
    "MASKED_CHOICE_DICT_ID",
    "MaskedChoiceEnv",
    "CounterEnv",
    "RepeatEnv",
    "DictEnv",
    "DICT_ID",
    "DICT_BOX_ID",
    "EpisodeLength",
    "make_counter_env",
    "make_repeat_env",
    "register_debug_envs",
]

COUNTER_ID = "rlstruct/Counter-v0"
REPEAT_ID = "rlstruct/Repeat-v0"
MASKED_CHOICE_ID = "rlstruct/MaskedChoice-v0"
MASKED_CHOICE_HIDDEN_ID = "rlstruct/MaskedChoiceHidden-v0"
MASKED_CHOICE_DICT_ID = "rlstruct/MaskedChoiceDict-v0"
DICT_ID = "rlstruct/Dict-v0"
DICT_BOX_ID = "rlstruct/DictBox-v0"

#: An episode length: an int, a list cycled over episodes, or ``f(env_id, episode) -> int``.
EpisodeLength = int | Sequence[int] | Callable[[int, int], int]

_COUNTER_HIGH = 2**62


class CounterEnv(gym.Env):
    """Observation ``[env_id, episode, t]`` (int64); see the module docstring.

    Args:
        env_id: the first number of every observation.
        episode_length: ``L`` per episode (int, list cycled per episode, or callable).
        n_actions: size of the ``Discrete`` action space.
        truncate: end episodes by truncation instead of termination.
        fail_at: ``(episode, t)``: raise ``RuntimeError`` in the step that reaches ``t``.
        hang_at: ``(episode, t)``: sleep ``hang_seconds`` in the step that reaches ``t``.
        hang_seconds: how long ``hang_at`` sleeps.

    Examples:
        >>> env = CounterEnv(env_id=7, episode_length=2)
        >>> env.reset()[0].tolist(), env.step(1)[:4]
        ([7, 0, 0], (array([7, 0, 1]), 1.0, False, False))
        >>> env.step(0)[2], env.reset()[0].tolist()
        (True, [7, 1, 0])
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self,
        env_id: int = 0,
        episode_length: EpisodeLength = 10,
        n_actions: int = 2,
        truncate: bool = False,
        fail_at: tuple[int, int] | None = None,
        hang_at: tuple[int, int] | None = None,
        hang_seconds: float = 3600.0,
    ) -> None:
        if n_actions < 1:
            raise ConfigError(f"n_actions must be >= 1, got {n_actions}")
        if isinstance(episode_length, Sequence) and not episode_length:
            raise ConfigError("episode_length: an empty list of lengths")
        self.env_id = int(env_id)
        self.episode_length = episode_length
        self.n_actions = int(n_actions)
        self.truncate = bool(truncate)
        self.fail_at = None if fail_at is None else tuple(fail_at)
        self.hang_at = None if hang_at is None else tuple(hang_at)
        self.hang_seconds = float(hang_seconds)
        self.observation_space = spaces.Box(0, _COUNTER_HIGH, (3,), np.int64)
        self.action_space = spaces.Discrete(self.n_actions)
        self.n_steps = 0
        self._episode = -1
        self._t = 0
        self._length = 0
        self._running = False

    def _episode_length(self, episode: int, options: dict[str, Any] | None) -> int:
        if options and "episode_length" in options:
            length = options["episode_length"]
        elif callable(self.episode_length):
            length = self.episode_length(self.env_id, episode)
        elif isinstance(self.episode_length, Sequence):
            length = self.episode_length[episode % len(self.episode_length)]
        else:
            length = self.episode_length
        length = int(length)
        if length < 1:
            raise ConfigError(
                f"CounterEnv {self.env_id}: episode {episode} has length {length}, expected >= 1"
            )
        return length

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._episode += 1
        self._t = 0
        self._length = self._episode_length(self._episode, options)
        self._running = True
        return (
            np.array((self.env_id, self._episode, 0), dtype=np.int64),
            {"episode_length": self._length},
        )

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self._running:
            raise RuntimeError(
                f"CounterEnv {self.env_id}: step() without a running episode; call reset()"
            )
        t = self._t + 1
        if self.fail_at is not None and (self._episode, t) == self.fail_at:
            raise RuntimeError(
                f"CounterEnv {self.env_id}: injected failure at episode {self._episode}, t={t}"
            )
        if self.hang_at is not None and (self._episode, t) == self.hang_at:
            time.sleep(self.hang_seconds)
        self._t = t
        self.n_steps += 1
        end = t >= self._length
        self._running = not end
        obs = np.array((self.env_id, self._episode, t), dtype=np.int64)
        return obs, float(action), end and not self.truncate, end and self.truncate, {}


class RepeatEnv(gym.Env):
    """Reward 1 for repeating the observed symbol; see the module docstring.

    Args:
        n_symbols: number of symbols (and of actions).
        episode_length: steps per episode.
        one_hot: observe a one-hot float32 vector (else the symbol as a ``Discrete`` int).
        truncate: end episodes by truncation instead of termination.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self,
        n_symbols: int = 2,
        episode_length: int = 10,
        one_hot: bool = True,
        truncate: bool = False,
    ) -> None:
        if n_symbols < 1 or episode_length < 1:
            raise ConfigError(
                f"RepeatEnv needs n_symbols >= 1 and episode_length >= 1, got {n_symbols} and "
                f"{episode_length}"
            )
        self.n_symbols = int(n_symbols)
        self.episode_length = int(episode_length)
        self.one_hot = bool(one_hot)
        self.truncate = bool(truncate)
        if self.one_hot:
            self.observation_space = spaces.Box(0.0, 1.0, (self.n_symbols,), np.float32)
            self._eye = np.eye(self.n_symbols, dtype=np.float32)
        else:
            self.observation_space = spaces.Discrete(self.n_symbols)
        self.action_space = spaces.Discrete(self.n_symbols)
        self._symbol = 0
        self._t = 0

    def _observe(self) -> np.ndarray | int:
        self._symbol = int(self.np_random.integers(self.n_symbols))
        return self._eye[self._symbol].copy() if self.one_hot else self._symbol

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray | int, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self._observe(), {}

    def step(self, action: Any) -> tuple[np.ndarray | int, float, bool, bool, dict[str, Any]]:
        reward = 1.0 if int(action) == self._symbol else 0.0
        self._t += 1
        end = self._t >= self.episode_length
        return self._observe(), reward, end and not self.truncate, end and self.truncate, {}


class MaskedChoiceEnv(gym.Env):
    """The action-mask task of the module docstring.

    Args:
        n_actions: ``A``, the size of the ``Discrete`` action space.
        n_legal: how many actions are legal at each step (``1 <= n_legal <= A``).
        episode_length: steps before truncation.
        penalty: the reward of an illegal action (which also terminates the episode).
        dict_obs: give the mask as a leaf of a Dict observation instead of in ``info``.
        hide_mask: give no mask at all (the same legal actions and penalty).
    """

    def __init__(self, n_actions: int = 16, n_legal: int = 2, episode_length: int = 20,
                 penalty: float = -10.0, dict_obs: bool = False, hide_mask: bool = False) -> None:
        if not 1 <= n_legal <= n_actions:
            raise ConfigError(f"n_legal must be in [1, n_actions={n_actions}], got {n_legal}")
        self.n_actions, self.n_legal = int(n_actions), int(n_legal)
        self.episode_length, self.penalty, self.dict_obs = int(episode_length), penalty, dict_obs
        self.action_space = spaces.Discrete(self.n_actions)
        box = spaces.Box(0.0, 1.0, (2,), np.float32)
        self.observation_space: spaces.Space = spaces.Dict(
            {"observation": box, "action_mask": spaces.MultiBinary(self.n_actions)}
        ) if dict_obs else box
        self._t, self.n_illegal, self.hide_mask = 0, 0, bool(hide_mask)
        self._mask = np.ones(self.n_actions, np.int8)

    def _observe(self) -> tuple[Any, dict[str, Any]]:
        self._mask = np.zeros(self.n_actions, np.int8)
        self._mask[self.np_random.choice(self.n_actions, self.n_legal, replace=False)] = 1
        box = np.array([self._t / self.episode_length, 1.0], np.float32)
        if self.dict_obs:
            return {"observation": box, "action_mask": self._mask.copy()}, {}
        return box, {} if self.hide_mask else {"action_mask": self._mask.copy()}

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self._observe()

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self._t += 1
        legal = bool(self._mask[int(action)])
        self.n_illegal += not legal
        obs, info = self._observe()
        truncated = legal and self._t >= self.episode_length
        return obs, 1.0 if legal else float(self.penalty), not legal, truncated, info


class DictEnv(gym.Env):
    """A Dict observation (a uint8 image and a float vector) whose reward needs both keys; see
    the module docstring.

    Args:
        episode_length: steps per episode.
        box_action: a ``Box(-1, 1, (1,))`` action (else ``Discrete(2)``).
        size: the image's height and width.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(self, episode_length: int = 8, box_action: bool = False, size: int = 16) -> None:
        self.episode_length, self.size = int(episode_length), int(size)
        self.observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (3, self.size, self.size), np.uint8),
            "vector": spaces.Box(-1.0, 1.0, (4,), np.float32)})
        self.action_space = (spaces.Box(-1.0, 1.0, (1,), np.float32) if box_action
                             else spaces.Discrete(2))
        self._right, self._t = 0, 0

    def _observe(self) -> dict[str, np.ndarray]:
        side, sign = (int(x) for x in self.np_random.integers(2, size=2))
        self._right = side if sign else 1 - side
        image = np.zeros((3, self.size, self.size), np.uint8)
        half = self.size // 2
        image[:, :, half * side: half * (side + 1)] = 200
        vector = self.np_random.uniform(-1.0, 1.0, 4).astype(np.float32)
        vector[0] = 1.0 if sign else -1.0
        return {"image": image, "vector": vector}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self._observe(), {}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        if isinstance(self.action_space, spaces.Box):
            target = 2.0 * self._right - 1.0
            reward = 1.0 - abs(float(np.asarray(action).reshape(-1)[0]) - target) / 2.0
        else:
            reward = 1.0 if int(action) == self._right else 0.0
        self._t += 1
        return self._observe(), reward, self._t >= self.episode_length, False, {}


def make_counter_env(
    n_envs: int,
    seed: int = 0,
    *,
    auto_reset: bool = False,
    env_id_offset: int = 0,
    info_keys: Sequence[str] = (),
    check_finite: bool = False,
    **kwargs: Any,
) -> GymEnv | GymEnvInf:
    """``n_envs`` CounterEnvs with ``env_id = env_id_offset + k`` as one VecEnv.

    Args:
        n_envs: ``N``.
        seed: the VecEnv seed (env ``k`` gets ``seed + k``).
        auto_reset: a :class:`GymEnvInf` instead of an episodic :class:`GymEnv`.
        env_id_offset: global id of env 0 (both the observed ``env_id`` and error messages).
        info_keys: forwarded to the VecEnv.
        check_finite: forwarded to the VecEnv.
        **kwargs: forwarded to :class:`CounterEnv` (``episode_length``, ``truncate``, ...).

    Examples:
        >>> env = make_counter_env(2, episode_length=3, env_id_offset=10)
        >>> env.reset()[0]["frame"].tolist()
        [[10, 0, 0], [11, 0, 0]]
    """
    cls = GymEnvInf if auto_reset else GymEnv
    factories = [partial(CounterEnv, env_id=env_id_offset + k, **kwargs) for k in range(n_envs)]
    return cls(
        factories,
        seed=seed,
        env_id_offset=env_id_offset,
        info_keys=info_keys,
        check_finite=check_finite,
    )


def make_repeat_env(
    n_envs: int,
    seed: int = 0,
    *,
    auto_reset: bool = True,
    env_id_offset: int = 0,
    **kwargs: Any,
) -> GymEnv | GymEnvInf:
    """``n_envs`` RepeatEnvs as one VecEnv (auto-reset by default); ``kwargs`` go to RepeatEnv."""
    cls = GymEnvInf if auto_reset else GymEnv
    factories = [partial(RepeatEnv, **kwargs) for _ in range(n_envs)]
    return cls(factories, seed=seed, env_id_offset=env_id_offset)


def register_debug_envs() -> None:
    """Registers ``rlstruct/Counter-v0``, ``rlstruct/Repeat-v0``, ``rlstruct/MaskedChoice-v0``,
    ``rlstruct/MaskedChoiceHidden-v0``, ``rlstruct/MaskedChoiceDict-v0``, ``rlstruct/Dict-v0``
    and ``rlstruct/DictBox-v0`` with gymnasium (idempotent)."""
    masked = "rlstruct.envs.debug:MaskedChoiceEnv"
    for env_id, entry_point, kwargs in (
        (COUNTER_ID, "rlstruct.envs.debug:CounterEnv", {}),
        (REPEAT_ID, "rlstruct.envs.debug:RepeatEnv", {}),
        (MASKED_CHOICE_ID, masked, {}),
        (MASKED_CHOICE_HIDDEN_ID, masked, {"hide_mask": True}),
        (MASKED_CHOICE_DICT_ID, masked, {"dict_obs": True}),
        (DICT_ID, "rlstruct.envs.debug:DictEnv", {}),
        (DICT_BOX_ID, "rlstruct.envs.debug:DictEnv", {"box_action": True}),
    ):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, kwargs=kwargs)

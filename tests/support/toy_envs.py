"""Toy envs that break a run's start or its collection, registered with gymnasium on import
(``--env-module support.toy_envs``; the worker processes import it too):

- ``DictObs-v0``: CartPole's dynamics behind a ``Dict`` observation space;
- ``TupleObs-v0``: the same behind a ``Tuple`` observation space;
- ``MultiDiscreteDictObs-v0``: the same with a ``MultiDiscrete`` leaf ``code`` beside ``pos``
  (a leaf the multi-input models do not take);
- ``CloseRaises-v0``: CartPole whose ``close()`` raises;
- ``HangingStep-v0``: CartPole whose step sleeps for an hour from its 5th step on (a hung
  simulator);
- ``SlowStep-v0``: CartPole whose every step sleeps 20 ms (a simulator that sets the pace:
  the workers are busy in a step most of the time, and the learner waits for them);
- ``EvalRaises-v0``: CartPole whose reset raises for a seed of the evaluation's (a run's
  evaluation seeds its envs from ``seed + 1000``, ``2**20`` seeds a run seed): the training
  envs work, the evaluation's fail;
- ``Frames-v0``: stacked uint8 frames ``(4, 84, 84)`` of random pixels (the Nature CNN's
  input, without Atari), ``Discrete(3)`` actions, reward 1 for action 0, 16 steps an episode.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

#: The step from which ``HangingStep-v0`` hangs.
HANG_AT = 5


#: Seconds each step of ``SlowStep-v0`` sleeps.
SLOW_STEP_S = 0.02


class DictObs(gym.Wrapper):
    """CartPole whose observations are ``{"pos": (2,), "vel": (2,)}``."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        box = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.observation_space = spaces.Dict({"pos": box, "vel": box})

    def _split(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        return {"pos": obs[[0, 2]], "vel": obs[[1, 3]]}

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._split(obs), info

    def step(self, action):
        obs, *rest = self.env.step(action)
        return (self._split(obs), *rest)


class TupleObs(DictObs):
    """CartPole whose observations are ``((2,), (2,))``."""

    def __init__(self) -> None:
        super().__init__()
        box = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.observation_space = spaces.Tuple((box, box))

    def _split(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return obs[[0, 2]], obs[[1, 3]]


class MultiDiscreteDictObs(DictObs):
    """CartPole whose observations are ``{"pos": (2,), "code": MultiDiscrete([2, 3])}``."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Dict({
            "pos": spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "code": spaces.MultiDiscrete([2, 3])})

    def _split(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        return {"pos": obs[[0, 2]], "code": np.array([0, 1], np.int64)}


class CloseRaises(gym.Wrapper):
    """CartPole whose ``close()`` raises."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def close(self) -> None:
        raise RuntimeError("the simulator's licence server is gone")


class HangingStep(gym.Wrapper):
    """CartPole whose step hangs from its ``HANG_AT``-th step on (counted over episodes)."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.n_steps = 0

    def step(self, action):
        self.n_steps += 1
        if self.n_steps >= HANG_AT:
            time.sleep(3600)
        return self.env.step(action)


class SlowStep(gym.Wrapper):
    """CartPole whose every step sleeps ``SLOW_STEP_S``."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def step(self, action):
        time.sleep(SLOW_STEP_S)
        return self.env.step(action)


class EvalRaises(gym.Wrapper):
    """CartPole whose reset raises for the seeds of a run's evaluation (see the module notes)."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def reset(self, *, seed=None, options=None):
        if seed is not None and seed >= 1000 * 2**20:
            raise RuntimeError(f"no evaluation scenario for seed {seed}")
        return self.env.reset(seed=seed, options=options)


class Frames(gym.Env):
    """Random uint8 frames ``(4, 84, 84)`` from the env's seeded RNG (see the module notes)."""

    observation_space = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, (4, 84, 84), dtype=np.uint8)

    def step(self, action):
        self.t += 1
        return self._frame(), float(action == 0), self.t >= 16, False, {}


for _name, _cls in (("DictObs-v0", DictObs), ("TupleObs-v0", TupleObs),
                    ("MultiDiscreteDictObs-v0", MultiDiscreteDictObs),
                    ("CloseRaises-v0", CloseRaises), ("HangingStep-v0", HangingStep),
                    ("SlowStep-v0", SlowStep),
                    ("EvalRaises-v0", EvalRaises), ("Frames-v0", Frames)):
    if _name not in gym.registry:
        gym.register(_name, entry_point=_cls, max_episode_steps=500)

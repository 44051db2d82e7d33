"""Bring your own vector env: a batched simulator as a gymnasium ``VectorEnv``, collected by the
batchers through :class:`rlstruct.envs.VectorEnvAdapter`.

``Particles`` steps ``N`` particles on a line in one numpy operation per step, as a GPU
simulator or an envpool-like library steps its whole batch: no Python loop over envs. It is a
``gymnasium.vector.VectorEnv`` in gymnasium's ``SAME_STEP`` auto-reset mode: the step that ends
an episode returns the first observation of the next one and the true final observation in
``info["final_obs"]`` (here as one batched array). The adapter turns it into rlstruct's VecEnv
contract: ``obs_t1`` holds the final observation, ``obs_next`` the new episode's first.

    python examples/vector_env.py

prints the episode ends of a SerialBatcher's batch, checks that each final observation is one
the episode could end on, and that a one-worker Batcher (whose worker builds its own
``Particles`` from the same factory) collects the same batch, bit for bit. Importing the module
registers ``Particles-v0`` with gymnasium (``Particle`` for ``gymnasium.make``, ``Particles`` as
its ``vector_entry_point``), so the algorithms train on it from the command line:

    PYTHONPATH=examples rlstruct train ppo --env-module vector_env --env-id Particles-v0 \
        --env-backend vector --max-frames 4000 --target-return None

(The docs: docs/concepts.md, "Your own vector env", and docs/algorithms.md, "Custom envs".)
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from rlstruct import Agent, Batcher, DictTensor, SerialBatcher
from rlstruct.envs import VectorEnvAdapter

LIMIT = 40  # steps before a truncation


class Particles(gym.vector.VectorEnv):
    """``num_envs`` particles: observation ``[position, velocity]`` (float32), action 0/1/2
    pushes left / not / right; an episode terminates when the particle leaves ``[-1, 1]`` and is
    truncated after ``LIMIT`` steps; reward 1 per step inside."""

    def __init__(self, num_envs: int) -> None:
        # What the adapter reads to know where the final observations are.
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_action_space = gym.spaces.Discrete(3)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space,
                                                              num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._rng = np.random.default_rng()
        self._state = np.zeros((num_envs, 2), np.float32)
        self._t = np.zeros(num_envs, np.int64)

    def _start(self, mask: np.ndarray) -> None:
        n = int(mask.sum())
        self._state[mask] = self._rng.uniform(-0.1, 0.1, (n, 2)).astype(np.float32)
        self._t[mask] = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._start(np.ones(self.num_envs, bool))
        return self._state.copy(), {}

    def step(self, actions: np.ndarray):
        push = (np.asarray(actions) - 1).astype(np.float32) * 0.02
        self._state[:, 1] += push + self._rng.normal(0, 0.01, self.num_envs).astype(np.float32)
        self._state[:, 0] += self._state[:, 1]
        self._t += 1
        terminated = np.abs(self._state[:, 0]) > 1
        truncated = ~terminated & (self._t >= LIMIT)
        reward = (~terminated).astype(np.float64)
        info: dict[str, Any] = {}
        done = terminated | truncated
        if done.any():  # SAME_STEP: report the final observations, then start anew
            info = {"final_obs": self._state.copy(), "_final_obs": done}
            self._start(done)
        return self._state.copy(), reward, terminated, truncated, info


class Particle(gym.Env):
    """ONE particle, as ``gymnasium.make`` gives it (what ``rlstruct train`` probes and
    evaluates): a ``Particles`` of one env, its final observation returned at an episode end."""

    def __init__(self) -> None:
        self._batch = Particles(1)
        self.observation_space = self._batch.single_observation_space
        self.action_space = self._batch.single_action_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        obs, info = self._batch.reset(seed=seed)
        return obs[0], info

    def step(self, action: int):
        obs, reward, terminated, truncated, info = self._batch.step(np.asarray([action]))
        if terminated[0] or truncated[0]:
            obs = info["final_obs"]
        return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), {}


def register() -> None:
    """Registers ``Particles-v0`` with both entry points (idempotent): ``gymnasium.make`` gives
    a ``Particle``, ``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")`` a
    ``Particles`` batch, which ``rlstruct train --env-backend vector`` trains on."""
    if "Particles-v0" not in gym.registry:
        gym.register("Particles-v0", entry_point=Particle, vector_entry_point=Particles)


register()  # on import: `--env-module vector_env` imports this module in every process


class Random(Agent):
    def __call__(self, state, observation, agent_info):
        n = observation["frame"].shape[0]
        return DictTensor({"action": torch.randint(3, (n,))}), state


def collect(batcher_class: type, **kwargs: Any):
    # env_args reach VectorEnvAdapter(make_env, n_envs, seed=...): each batcher process calls
    # make_env(num_envs=n_envs) and seeds the first reset with the seed the batcher gives it.
    env_args = {"make_env": Particles, "n_envs": 8}
    with batcher_class(n_timesteps=100, create_agent=Random, agent_args={},
                       create_env=VectorEnvAdapter, env_args=env_args, seeds=0, **kwargs) as b:
        b.reset()
        b.execute()
        traj, _ = b.get()
        return traj


def check(steps: DictTensor) -> tuple[int, int]:
    """Every episode end holds a true final observation, and the next step starts anew."""
    done = steps["_observation/done"]
    term, trunc = steps["_observation/terminated"], steps["_observation/truncated"]
    position = steps["_observation/frame"][..., 0]
    assert torch.all(position[term].abs() > 1)  # the particle left: not a reset observation
    assert torch.all(steps["_observation/env_step"][trunc] == LIMIT)
    after = done[:, :-1]
    assert torch.all(steps["observation/initial_state"][:, 1:][after])
    assert torch.all(steps["observation/frame"][:, 1:, 0][after].abs() <= 0.1)
    return int(term.sum()), int(trunc.sum())


if __name__ == "__main__":
    adapter = functools.partial(VectorEnvAdapter, Particles, n_envs=2, seed=0)
    print(adapter())  # VectorEnvAdapter(<Particles...>, n_envs=2, seed=0, autoreset_mode=SAME_STEP)
    here = collect(SerialBatcher)
    terminated, truncated = check(here.trajectories)
    print(f"episode ends: {terminated} terminated, {truncated} truncated, all with their "
          "true final observation")
    there = collect(Batcher, n_processes=1)
    same = here.trajectories.equal(there.trajectories) and here.info.equal(there.info)
    print("same batch:", same)

"""Tutorial 03 — Environments: N gymnasium envs behind one DictTensor interface.

A VecEnv steps N envs together: reset() gives the first observation of every env, step(action)
takes one action row per RUNNING env and answers with two DictTensors: obs_t1 (the env's answer
to the action: next observation, reward, flags) and obs_next (what the agent sees next). GymEnv
is episodic (an env whose episode ended stops running); GymEnvInf resets envs itself and runs
all N forever. This tutorial steps both by hand, then writes, registers and steps its own env.

The runnable companion of one page, which explains it and links here:
[Concepts](../docs/concepts.md#environments).

Run: python tutorials/03_environments.py   (finishes in about two seconds on a CPU)
"""

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from rlstruct import DictTensor
from rlstruct.envs import GymEnv, make_counter_env
from rlstruct.errors import ActionError


def actions(n: int, value: int = 1) -> DictTensor:
    """One Discrete action per running env: the agent's output always holds the key "action"."""
    return DictTensor({"action": torch.full((n,), value, dtype=torch.long)})


# --- Episodic: GymEnv -------------------------------------------------------------------------
# A gymnasium id and a number of envs; env k is seeded seed + k on its first reset.
env = GymEnv("CartPole-v1", n_envs=3, seed=0)
obs, running = env.reset()
# Besides the env's own observation ("frame" for a Box space), every observation carries the
# same bookkeeping keys: reward, terminated, truncated, done, initial_state, last_action, env_step.
print(obs)
print("running:", running.tolist())

# Always pushing right topples the poles quickly. The set of running envs shrinks as episodes end,
# and the next action must have one row per env still running, in the order of `running`.
while running.numel() > 0:
    (obs_t1, was_running), (obs_next, running) = env.step(actions(running.numel()))
    if obs_t1["done"].any():
        ended = was_running[obs_t1["done"]].tolist()
        print(f"  env_step {obs_t1['env_step'][0].item():2d}: envs {ended} ended "
              f"(terminated={obs_t1['terminated'][obs_t1['done']].tolist()}), "
              f"still running {running.tolist()}")
# Every episode is over: stepping again would raise BatcherStateError; reset() starts new ones.
env.close()

# --- Auto-reset: GymEnvInf --------------------------------------------------------------------
# The counter env observes [env_id, episode, t]; here env k's episodes last 2 + k steps.
# When an episode ends, obs_t1 keeps its TRUE final observation (the one a value function must
# bootstrap from) while obs_next already shows the first observation of the next episode.
print("\nGymEnvInf over two counter envs, frame = [env_id, episode, t]:")
inf = make_counter_env(2, episode_length=lambda env_id, episode: 2 + env_id, auto_reset=True)
obs, running = inf.reset()
for _ in range(4):
    (obs_t1, _), (obs_next, running) = inf.step(actions(2, 0))
    print(f"  obs_t1 {obs_t1['frame'].tolist()} done {obs_t1['done'].tolist()}"
          f" -> obs_next {obs_next['frame'].tolist()} initial_state "
          f"{obs_next['initial_state'].tolist()}")
print("  all", running.numel(), "envs keep running")
inf.close()


# --- Your own env, with a Dict observation space ----------------------------------------------
class Rover(gym.Env):
    """A rover on a line: walk towards the goal; a Dict observation of three dtypes."""

    def __init__(self, size: int = 3) -> None:
        self.size = size
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(0.0, 100.0, (1,), np.float32),
                "camera": spaces.Box(0, 255, (2, 2), np.uint8),
                "sensors": spaces.Dict({"battery": spaces.Box(0.0, 1.0, (), np.float64)}),
            }
        )
        self.action_space = spaces.Discrete(2)  # 0: stay, 1: move forward

    def _obs(self) -> dict:
        frame = np.full((2, 2), 50 * self.pos, dtype=np.uint8)
        return {
            "position": np.array([self.pos], np.float32),
            "camera": frame,
            "sensors": {"battery": np.array(self.battery, np.float64)},
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.battery = 0, 1.0
        return self._obs(), {}

    def step(self, action):
        self.pos += int(action)
        self.battery -= 0.25
        reached = self.pos >= self.size - 1
        return self._obs(), float(reached), reached, False, {}


# Register it under an id (the entry point may be the class itself or "module:Class"); the
# max_episode_steps wrapper truncates episodes, which rlstruct keeps apart from termination.
gym.register(id="tutorial/Rover-v0", entry_point=Rover, max_episode_steps=3)
rovers = GymEnv("tutorial/Rover-v0", n_envs=2, seed=0)
obs, running = rovers.reset()
# A Dict space becomes one key per leaf, nested dicts joined with "/"; dtypes are preserved
# (uint8 frames stay uint8, float64 stays float64) so nothing is cast behind your back.
print("\nRover observation keys and dtypes:")
for key, value in obs.items():
    if key in ("position", "camera", "sensors/battery"):
        print(f"  {key:16s} {tuple(value.shape)} {value.dtype}")

# Env 0 moves and reaches the goal (terminated), env 1 stays and hits the time limit (truncated).
while running.numel() > 0:
    move = (running == 0).long()
    (obs_t1, was_running), (obs_next, running) = rovers.step(DictTensor({"action": move}))
    for j in torch.nonzero(obs_t1["done"]).flatten().tolist():
        print(f"  env {was_running[j].item()} ended at env_step {obs_t1['env_step'][j].item()}: "
              f"terminated={obs_t1['terminated'][j].item()}, "
              f"truncated={obs_t1['truncated'][j].item()}")

# The same env without registering: a list of zero-argument factories, one per env.
rovers = GymEnv([lambda: Rover(size=3), lambda: Rover(size=5)], seed=1)
obs, running = rovers.reset()
print("from factories:", rovers.n_envs(), "envs, positions", obs["position"].flatten().tolist())

# Actions are checked for every row at once BEFORE any env is stepped; the error names the env,
# the action and the space, and the VecEnv stays usable.
try:
    rovers.step(DictTensor({"action": torch.tensor([1, 7])}))
except ActionError as e:
    print("\nrefused:", e)
(obs_t1, _), _ = rovers.step(actions(2))
print("still usable: positions", obs_t1["position"].flatten().tolist())
rovers.close()

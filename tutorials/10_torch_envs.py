"""Tutorial 10 — Torch-native envs: N environments as one tensor, on the batcher's device.

A GymEnv steps its gymnasium envs one after the other in Python: per env and per step, a call,
a numpy array, a write. When the dynamics are a few lines of maths, that loop is the whole cost.
rlstruct.envs.torch writes them as tensor maths over a state (N, d): one step of 4096 CartPoles
is ~30 tensor ops, whatever N, on the CPU or on the GPU where the agent already is.

This tutorial steps a torch CartPole by hand, checks it against gymnasium's, shows the seeding
rule, collects with a SerialBatcher, and writes a new env in a dozen lines.

The runnable companion of one page, which explains it and links here:
[Torch-native envs](../docs/guide-torch-envs.md).

Run: python tutorials/10_torch_envs.py   (about five seconds on a CPU)
"""

import time

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from rlstruct import Agent, DictTensor, SerialBatcher
from rlstruct.envs import GymEnvInf
from rlstruct.envs.torch import CartPole, TorchVecEnv
from rlstruct.errors import ActionError

torch.set_num_threads(1)


def push(n: int, value: int = 1) -> DictTensor:
    return DictTensor({"action": torch.full((n,), value, dtype=torch.long)})


# --- 1. A torch env is a VecEnv -----------------------------------------------------------------
# The constructor is create_env's: CartPole(n_envs, seed, device, dtype, max_episode_steps), plus
# auto_reset (False: episodic like GymEnv; True: every env restarts inside step, like GymEnvInf).
env = CartPole(n_envs=4, seed=0, auto_reset=True)
obs, running = env.reset()
# The same keys, shapes and dtypes as GymEnv("CartPole-v1") gives: the float32 frame plus the
# bookkeeping keys. The state is one tensor (N, d) in gymnasium's own layout (x, x_dot, theta,
# theta_dot), readable and writable.
print(obs)
print("state:", tuple(env.state.shape), env.state.dtype, "on", env.device)

# Pushing right topples the poles after ~10 steps. At the end of an episode obs_t1 holds the TRUE
# final observation (outside the bounds: that is why it ended) and obs_next the first one of the
# next episode, drawn inside the same step: no Python loop over envs anywhere.
for _ in range(12):
    (obs_t1, _), (obs_next, _) = env.step(push(4))
    if obs_t1["done"].any():
        k = int(obs_t1["done"].nonzero()[0])
        print(f"env {k} ended at env_step {int(obs_t1['env_step'][k])}: final theta "
              f"{float(obs_t1['frame'][k, 2]):+.3f} (terminated), next episode starts at theta "
              f"{float(obs_next['frame'][k, 2]):+.3f}, env_step {int(obs_next['env_step'][k])}")
        break

# --- 2. The same physics as gymnasium's ---------------------------------------------------------
# With a float64 state (dtype=torch.float64) and gymnasium's state copied in, the two agree to
# the last bits step after step (tests/envs/test_envs_torch.py checks 1000-step rollouts of all four
# envs: CartPole, Acrobot, MountainCar, Pendulum).
ref = gym.make("CartPole-v1")
ref.reset(seed=1)
twin = CartPole(n_envs=1, seed=0, dtype=torch.float64)
twin.reset()
twin.state[0] = torch.as_tensor(ref.unwrapped.state)
rng = np.random.default_rng(0)
worst, n_steps = 0.0, 0
while n_steps < 200:
    n_steps += 1
    a = int(rng.integers(2))
    ref_obs, ref_reward, terminated, truncated, _ = ref.step(a)
    (obs_t1, _), (_, running) = twin.step(push(1, a))
    worst = max(worst, float(np.abs(obs_t1["frame"][0].numpy() - ref_obs).max()))
    assert bool(obs_t1["terminated"][0]) == terminated and float(obs_t1["reward"][0]) == ref_reward
    if terminated or truncated:
        break
print(f"\ngymnasium vs torch CartPole: {n_steps} steps, largest observation gap {worst:.1e}")

# --- 3. Seeds: each env has its own stream ------------------------------------------------------
# Env k of CartPole(seed=s) draws every initial state from its own counter-based stream, keyed by
# s + k: it does not depend on N, on the other envs, or on how envs are split among processes.
# Same rule as GymEnv (env k gets seed s + k), so batchers give every env the same episodes
# whatever the number of workers.
eight = CartPole(n_envs=8, seed=3)
alone = CartPole(n_envs=1, seed=8)
for episode in ("first", "second"):  # every reset draws the next initial state of the stream
    same = torch.equal(eight.reset()[0]["frame"][5], alone.reset()[0]["frame"][0])
    assert same, "env 5 of seed 3 must play the episodes of env 0 of seed 8"
    print(f"{episode} episode: env 5 of seed 3 == env 0 of seed 8: {same}")


# --- 4. In a batcher ----------------------------------------------------------------------------
class Policy(Agent):
    """A small MLP whose actions are sampled from its softmax (it runs on the env's device)."""

    def __init__(self) -> None:
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(),
                                         torch.nn.Linear(64, 2))

    def __call__(self, state, observation, agent_info):
        logits = self.model(observation["frame"])
        action = torch.distributions.Categorical(logits=logits).sample()
        return DictTensor({"action": action}), state


def collect(create_env, env_args: dict, n_batches: int = 3) -> float:
    """Steps per second of a SerialBatcher (T=32) over the given env."""
    with SerialBatcher(32, Policy, {}, create_env, env_args, seeds=0) as b:
        b.reset()
        b.execute()
        b.get()  # warm-up
        t0, steps = time.perf_counter(), 0
        for _ in range(n_batches):
            b.execute()
            traj, _ = b.get()
            steps += int(traj.trajectories.lengths.sum())
        return steps / (time.perf_counter() - t0)


# The class is the create_env: SerialBatcher builds CartPole(**env_args, seed=s). On a GPU, add
# "device": "cuda" to env_args and device="cuda" to the batcher: agent, env and buffer then share
# the GPU and nothing crosses to the host.
torch_speed = collect(CartPole, {"n_envs": 2048, "auto_reset": True})
gym_speed = collect(GymEnvInf, {"env": "CartPole-v1", "n_envs": 64}, n_batches=2)
print(f"\nSerialBatcher, torch CartPole x 2048: {torch_speed:10,.0f} steps/s")
print(f"SerialBatcher, GymEnvInf(64):          {gym_speed:10,.0f} steps/s "
      f"(torch: {torch_speed / gym_speed:.0f}x)")


# --- 5. Your own torch env ----------------------------------------------------------------------
class Reach(TorchVecEnv):
    """A point on a line must stop on a target: state (position, velocity, target).

    Declare the spaces and sizes, then write three pure batched functions; the base class
    handles reset, auto-reset, time limits, action checks, seeding and the observation keys.
    """

    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = spaces.Discrete(3)  # accelerate left, coast, accelerate right
    state_size = 3
    n_draws = 2  # uniforms per reset: the start and the target
    default_max_episode_steps = 100

    def initial_state(self, u, options):
        position, target = 2 * u[:, 0] - 1, 2 * u[:, 1] - 1  # both uniform in [-1, 1]
        return torch.stack((position, torch.zeros_like(position), target), dim=1)

    def dynamics(self, state, action):
        position, velocity, target = state.unbind(1)
        velocity = 0.9 * velocity + 0.01 * (action - 1).to(state.dtype)
        position = position + velocity
        gap = (position - target).abs()
        terminated = (gap < 0.02) & (velocity.abs() < 0.01)
        reward = torch.where(terminated, 10.0, -gap).to(torch.float32)
        return torch.stack((position, velocity, target), dim=1), reward, terminated

    def observe(self, state):
        return state.to(torch.float32, copy=True)  # a new tensor, never a view of the state


reach = Reach(n_envs=256, seed=0, auto_reset=True)
obs, _ = reach.reset()
ends = terminated = 0
for _ in range(300):
    # A hand-made controller: accelerate towards the target, brake when close.
    pos, vel, target = obs["frame"].unbind(1)
    wanted = (target - pos).clamp(-0.05, 0.05)
    action = torch.where(wanted - vel > 0.003, 2, torch.where(wanted - vel < -0.003, 0, 1))
    (obs_t1, _), (obs, _) = reach.step(DictTensor({"action": action}))
    ends += int(obs_t1["done"].sum())
    terminated += int(obs_t1["terminated"].sum())
print(f"\nReach x 256, 300 steps: {ends} episodes ended, {terminated} on the target")
try:
    reach.step(DictTensor({"action": torch.full((256,), 3)}))
except ActionError as e:  # checked for every row at once, before any env moves
    print(f"{type(e).__name__}: {str(e)[:70]}...")

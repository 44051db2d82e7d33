"""A full-size port of rlstructures' REINFORCE example runs on rlstruct.compat.

The program below has the shape of rlstructures' REINFORCE tutorial (``rlalgos/reinforce``): a
``create_gym_env`` / ``create_env`` pair building CartPole with a time limit, an ``RL_Agent``
holding a policy and a baseline, a logger, an ``Experiment`` whose ``run`` builds an evaluation
batcher and a training batcher (two worker processes), and the loop ``reset / execute / get /
replay_agent / loss / update`` with the evaluation batcher polled without blocking and relaunched
with the latest weights. It is written here for rlstruct (not copied), in rlstructures' style, and
each place where a port has to change something is marked ``PORT:``; docs/migrating-from-
rlstructures.md ("A full port, step by step") explains each one.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import gymnasium as gym
import pytest
import torch
import torch.nn as nn

from rlstruct.blocks.functional import discounted_returns
from rlstruct.compat import (
    DictTensor,
    GymEnv,
    RL_Agent,
    RL_Agent_CheckDevice,
    RL_Batcher,
    Trajectories,
    masked_tensor,
    replay_agent,
)
from rlstruct.errors import ConfigError

CONFIG: dict[str, Any] = {
    "env_name": "CartPole-v1",
    "n_envs": 4,
    "max_episode_steps": 60,
    "env_seed": 42,
    "n_processes": 2,
    "n_evaluation_processes": 1,
    "n_evaluation_envs": 16,
    "n_iterations": 6,  # rlstructures' loop ran for `time_limit` seconds
    "lr": 0.01,
    "discount_factor": 0.95,
    "baseline_coef": 0.1,
    "entropy_coef": 0.01,
    "reinforce_coef": 1.0,
    "evaluation_mode": "stochastic",
}


# ----------------------------------------------------------------- environments
def create_gym_env(env_name: str, max_episode_steps: int | None = None) -> gym.Env:
    # PORT: gymnasium's TimeLimit refuses max_episode_steps=None (gym read it as "the registered
    # limit"); gym.make takes the limit itself and keeps the registered one for None.
    return gym.make(env_name, max_episode_steps=max_episode_steps)


def create_env(
    n_envs: int, env_name: str | None = None, max_episode_steps: int | None = None, seed: int = 0
) -> GymEnv:
    # PORT: rlstructures' GymEnv(envs, seed) took env instances and the seed second; rlstruct's
    # takes zero-argument factories (each builds a fresh env), n_envs second, and seed= by keyword.
    factory = lambda: create_gym_env(env_name, max_episode_steps)  # noqa: E731
    return GymEnv([factory] * n_envs, seed=seed)


# ----------------------------------------------------------------- agent and models
class PolicyNet(nn.Module):
    """Action probabilities of an observation (one hidden tanh layer)."""

    def __init__(self, n_observations: int, n_actions: int, n_hidden: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(n_observations, n_hidden)
        self.out = nn.Linear(n_hidden, n_actions)

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.out(torch.tanh(self.hidden(frame))), dim=-1)


class BaselineNet(nn.Module):
    """V(s), one scalar per observation."""

    def __init__(self, n_observations: int, n_hidden: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(n_observations, n_hidden)
        self.out = nn.Linear(n_hidden, 1)

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(frame))).squeeze(-1)


class PolicyAndBaseline(nn.Module):
    def __init__(self, policy: nn.Module, baseline: nn.Module) -> None:
        super().__init__()
        self.policy = policy
        self.baseline = baseline


class ReinforceAgent(RL_Agent):
    """Samples (``agent_info["stochastic"]``) or takes the most probable action; memoryless."""

    def __init__(self, model: PolicyAndBaseline | None = None, n_actions: int | None = None):
        super().__init__()
        self.model = model
        self.n_actions = n_actions

    def update(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state_dict)

    def initial_state(self, agent_info: DictTensor, B: int) -> DictTensor:  # noqa: N803
        return DictTensor({})

    def __call__(
        self,
        state: DictTensor,
        observation: DictTensor,
        agent_info: DictTensor | None = None,
        history: Any = None,
    ) -> tuple[DictTensor, DictTensor]:
        frame = observation["frame"]  # float32: CartPole's dtype, kept by rlstruct
        probabilities = self.model.policy(frame)
        sampled = torch.distributions.Categorical(probabilities).sample()
        greedy = probabilities.argmax(1)
        action = masked_tensor(greedy, sampled, agent_info["stochastic"])
        out = DictTensor(
            {
                "action": action,
                "action_probabilities": probabilities,
                "baseline": self.model.baseline(frame),
            }
        )
        return out, DictTensor({})


def create_agent(model: PolicyAndBaseline, n_actions: int = 1) -> ReinforceAgent:
    return ReinforceAgent(model=model, n_actions=n_actions)


# ----------------------------------------------------------------- logger
class Logger:
    """rlstructures' logger, in memory: ``add_scalar(name, value, iteration)``, ``get_scalars``."""

    def __init__(self, **hps: Any) -> None:
        self.hps = hps
        self.values: dict[str, list[tuple[int, float]]] = {}

    def add_scalar(self, name: str, value: float | torch.Tensor, iteration: int) -> None:
        if isinstance(value, torch.Tensor):
            value = value.item()
        self.values.setdefault(name, []).append((iteration, float(value)))

    def get_scalars(self, name: str) -> list[float]:
        return [v for _, v in self.values.get(name, [])]

    def close(self) -> None:
        pass


# ----------------------------------------------------------------- the experiment
class Reinforce:
    def __init__(self, config: dict[str, Any], create_env: Any, create_agent: Any) -> None:
        self.config = config
        self.logger = Logger(**config)
        self._create_env = create_env
        self._create_agent = create_agent
        self.checks: dict[str, Any] = {"losses": [], "batches": [], "evaluations": []}

    def _stochastic(self, n: int, stochastic: bool = True) -> DictTensor:
        return DictTensor({"stochastic": torch.tensor([stochastic]).repeat(n)})

    def run(self) -> None:
        c = self.config
        env = self._create_env(c["n_envs"], seed=0, env_name=c["env_name"])
        self.n_actions = env.action_space.n
        self.obs_dim = env.reset()[0]["frame"].size()[1]
        env.close()  # PORT: rlstructures only dropped it (`del env`); close the envs

        self.learning_model = PolicyAndBaseline(
            PolicyNet(self.obs_dim, self.n_actions, 16), BaselineNet(self.obs_dim, 16)
        )
        # The learner's agent, checked to stay on the CPU while replaying.
        self.agent = RL_Agent_CheckDevice(
            self._create_agent(n_actions=self.n_actions, model=self.learning_model), "cpu"
        )
        env_args = {
            "n_envs": c["n_envs"],
            "max_episode_steps": c["max_episode_steps"],
            "env_name": c["env_name"],
        }
        evaluation_env_args = {**env_args, "n_envs": c["n_evaluation_envs"]}
        self.evaluation_batcher = RL_Batcher(
            n_timesteps=c["max_episode_steps"],
            create_agent=self._create_agent,
            agent_args={"n_actions": self.n_actions, "model": copy.deepcopy(self.learning_model)},
            create_env=self._create_env,
            env_args=evaluation_env_args,
            n_processes=c["n_evaluation_processes"],
            # PORT: rlstructures' seeds env_seed + 10 * p overlap with 16 envs per process (now
            # refused); one int run seed gives env g the seed s * 2**20 + g, and another run seed
            # than training's keeps evaluation episodes apart from training ones.
            seeds=c["env_seed"] + 1,
            agent_info=self._stochastic(1),
            env_info=DictTensor({}),
        )
        try:
            self.train_batcher = RL_Batcher(
                n_timesteps=c["max_episode_steps"],
                create_agent=self._create_agent,
                agent_args={
                    "n_actions": self.n_actions,
                    "model": copy.deepcopy(self.learning_model),
                },
                create_env=self._create_env,
                env_args=env_args,
                n_processes=c["n_processes"],
                # rlstructures' per-process list still works when spaced by at least n_envs.
                seeds=[c["env_seed"] + p * c["n_envs"] for p in range(c["n_processes"])],
                agent_info=self._stochastic(1),
                env_info=DictTensor({}),
                agent_seeds=[c["env_seed"] + p for p in range(c["n_processes"])],
            )
        except BaseException:
            self.evaluation_batcher.close()
            raise
        try:
            self._loop()
        finally:
            self.train_batcher.close()
            self.evaluation_batcher.close()
            self.logger.close()

    def _launch_evaluation(self) -> None:
        c = self.config
        n = c["n_evaluation_processes"] * c["n_evaluation_envs"]
        self.evaluation_batcher.update(self.learning_model.state_dict())
        self.evaluation_iteration = self.iteration
        self.evaluation_batcher.reset(
            agent_info=self._stochastic(n, c["evaluation_mode"] == "stochastic")
        )
        self.evaluation_batcher.execute()

    def _evaluated(self, trajectories: Trajectories, n_running: int) -> None:
        assert n_running == 0  # every evaluation episode ended within n_timesteps
        steps = trajectories.trajectories
        returns = (steps["_observation/reward"] * steps.mask()).sum(1)
        self.logger.add_scalar(
            "evaluation_reward/" + self.config["evaluation_mode"],
            returns.mean(),
            self.evaluation_iteration,
        )
        self.checks["evaluations"].append(trajectories)

    def _loop(self) -> None:
        c = self.config
        optimizer = torch.optim.RMSprop(self.learning_model.parameters(), lr=c["lr"])
        self.iteration = 0
        start = time.time()
        self._launch_evaluation()
        self.train_batcher.update(self.learning_model.state_dict())
        n_interactions = 0
        for _ in range(c["n_iterations"]):
            self.train_batcher.reset(agent_info=self._stochastic(c["n_envs"] * c["n_processes"]))
            self.train_batcher.execute()
            trajectories, n_running = self.train_batcher.get(blocking=True)
            assert n_running == 0
            self.checks["batches"].append(trajectories)
            n_interactions += trajectories.trajectories.mask().sum().item()
            self.logger.add_scalar(
                "n_interactions_per_seconds", n_interactions / (time.time() - start), self.iteration
            )

            losses = self.get_loss(trajectories)
            for name, value in losses.items():  # PORT: a dict of scalars, not a DictTensor
                self.logger.add_scalar("loss/" + name, value, self.iteration)
            loss = (
                c["baseline_coef"] * losses["baseline_loss"]
                - c["entropy_coef"] * losses["entropy_loss"]
                - c["reinforce_coef"] * losses["reinforce_loss"]
            )
            self.checks["losses"].append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            self.train_batcher.update(self.learning_model.state_dict())
            self.iteration += 1

            evaluation, n_running = self.evaluation_batcher.get(blocking=False)
            if evaluation is not None:
                self._evaluated(evaluation, n_running)
                self._launch_evaluation()
        evaluation, n_running = self.evaluation_batcher.get()  # wait for the last evaluation
        self._evaluated(evaluation, n_running)

    def get_loss(self, trajectories: Trajectories) -> dict[str, torch.Tensor]:
        replayed = replay_agent(self.agent, trajectories)
        steps = trajectories.trajectories
        mask = steps.mask()  # PORT: a bool mask (rlstructures: float); `x * mask` still works
        reward = steps["_observation/reward"] * mask
        T = steps.lengths.max().item()  # noqa: N806
        future = torch.zeros_like(reward)  # the discounted future reward, as rlstructures did
        future[:, T - 1] = reward[:, T - 1]
        for t in range(T - 2, -1, -1):
            future[:, t] = reward[:, t] + self.config["discount_factor"] * future[:, t + 1]
        # rlstruct.blocks.functional computes the same returns in one call.
        assert torch.allclose(
            future,
            discounted_returns(
                steps["_observation/reward"],
                steps["_observation/terminated"],
                steps["_observation/truncated"],
                steps.lengths,
                self.config["discount_factor"],
            ),
            atol=1e-4,
        )

        distribution = torch.distributions.Categorical(replayed["action_probabilities"])
        baseline = replayed["baseline"]
        advantage = (future - baseline).detach()
        log_probability = distribution.log_prob(steps["action/action"])
        n_steps = mask.sum(1)

        def per_row_mean(x: torch.Tensor) -> torch.Tensor:
            return ((x * mask).sum(1) / n_steps).mean()

        return {
            "avg_reward": future[:, 0].mean(),
            "baseline_loss": per_row_mean((baseline - future) ** 2),
            "reinforce_loss": per_row_mean(log_probability * advantage),
            "entropy_loss": per_row_mean(distribution.entropy()),
        }


# Spawned workers cannot import tests/: send this module's classes and functions by value.


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_full_rlstructures_reinforce_port_runs_on_cartpole():
    torch.manual_seed(0)
    exp = Reinforce(CONFIG, create_env, create_agent)
    exp.run()
    c = CONFIG
    B, n_eval = c["n_envs"] * c["n_processes"], c["n_evaluation_envs"]  # noqa: N806

    # Training: one full batch of ended episodes per iteration, finite losses, all logged.
    assert len(exp.checks["batches"]) == c["n_iterations"]
    for traj in exp.checks["batches"]:
        steps = traj.trajectories
        assert traj.info["env_id"].tolist() == list(range(B))
        assert steps["observation/frame"].shape == (B, steps.n_timesteps(), 4)
        assert steps["observation/frame"].dtype == torch.float32
        assert 1 <= steps.lengths.min() and steps.lengths.max() <= c["max_episode_steps"]
        assert steps["_observation/done"][torch.arange(B), steps.lengths - 1].all()
    assert all(math.isfinite(v) for v in exp.checks["losses"])
    for name in ("loss/baseline_loss", "loss/reinforce_loss", "loss/entropy_loss"):
        assert len(exp.logger.get_scalars(name)) == c["n_iterations"], name
        assert all(math.isfinite(v) for v in exp.logger.get_scalars(name)), name
    assert all(v > 0 for v in exp.logger.get_scalars("n_interactions_per_seconds"))

    # Evaluation: at least the last one, logged; CartPole pays 1 per step until the time limit.
    evaluations = exp.checks["evaluations"]
    rewards = exp.logger.get_scalars("evaluation_reward/stochastic")
    assert len(rewards) == len(evaluations) >= 1
    assert all(1.0 <= r <= c["max_episode_steps"] for r in rewards)
    for traj in evaluations:
        steps = traj.trajectories
        assert traj.n_elems() == n_eval and traj.info["env_id"].tolist() == list(range(n_eval))
        returns = (steps["_observation/reward"] * steps.mask()).sum(1)
        assert torch.equal(returns, steps.lengths.float())
        # Every evaluation env has a seed of its own: no two rows start the same episode ...
        starts = steps["observation/frame"][:, 0]
        assert torch.unique(starts, dim=0).shape[0] == n_eval
        assert steps["observation/initial_state"][:, 0].all()
    # ... and none starts like a training env (another run seed than training's).
    first_train_starts = exp.checks["batches"][0].trajectories["observation/frame"][:, 0]
    first_eval_starts = evaluations[0].trajectories["observation/frame"][:, 0]
    assert not (first_eval_starts[:, None] == first_train_starts[None]).all(-1).any()


def test_rlstructures_evaluation_seeds_with_many_envs_per_process_are_refused():
    """rlstructures' evaluation batcher seeded its processes ``env_seed + 10 * p`` with 128 envs
    each: the env seeds of the processes overlapped (silently in rlstructures)."""
    with pytest.raises(ConfigError, match=r"env seeds overlap.*space the per-process seeds"):
        RL_Batcher(
            n_timesteps=10,
            create_agent=create_agent,
            agent_args={"model": PolicyAndBaseline(PolicyNet(4, 2, 8), BaselineNet(4, 8))},
            create_env=create_env,
            env_args={"n_envs": 16, "env_name": "CartPole-v1"},
            n_processes=2,
            seeds=[42 + 10 * p for p in range(2)],
            agent_info=DictTensor({"stochastic": torch.tensor([True])}),
            env_info=DictTensor({}),
        )


def test_rlstructures_create_env_is_refused_with_the_port():
    """rlstructures' ``create_env`` (instances through TimeLimit, ``GymEnv(envs, seed)``) fails
    with errors naming the fix, before any batcher starts."""

    def rlstructures_create_env(n_envs, env_name=None, max_episode_steps=None, seed=None):
        envs = []
        for _ in range(n_envs):
            e = gym.make(env_name)
            if max_episode_steps is not None:  # TimeLimit(e, None) would raise already
                e = gym.wrappers.TimeLimit(e, max_episode_steps=max_episode_steps)
            envs.append(e)
        return GymEnv(envs, seed)

    with pytest.raises(ConfigError, match=r"GymEnv\('CartPole-v1', n_envs=4, seed=7\)"):
        rlstructures_create_env(4, env_name="CartPole-v1", max_episode_steps=50, seed=7)
    with pytest.raises(TypeError, match="max_episode_steps"):
        gym.wrappers.TimeLimit(gym.make("CartPole-v1"), max_episode_steps=None)
    env = create_env(4, env_name="CartPole-v1", max_episode_steps=50, seed=7)
    with env:
        assert env.n_envs() == 4 and env.envs[0].spec.max_episode_steps == 50
        assert len({id(e.unwrapped) for e in env.envs}) == 4

"""rlstruct.compat: an rlstructures-style REINFORCE runs on rlstruct, plus the argument mapping.

``ReinforceAgent``, the models, ``get_loss`` and the training loop follow rlstructures'
``rlalgos/reinforce`` (an ``RL_Agent`` subclass with ``__call__(self, state, observation,
agent_info=None, history=None)``, an ``RL_Batcher`` built with positional arguments, the loop
``reset / execute / get / replay_agent / update``), without its logger and evaluation batcher, and
with ``seed`` seeding torch (the original printed the seed) so that the test is deterministic.
Against that original, the port needed:

1. the imports pointing at ``rlstruct.compat``;
2. ``create_env`` passing a gymnasium id to ``GymEnv`` (rlstruct's GymEnv builds its envs from an
   id or from factories, not from env instances);
3. ``get_loss`` returning a dict of scalars (a DictTensor refuses 0-d tensors: no batch dim).
"""

from __future__ import annotations

import copy
import inspect
import time

import pytest
import torch
import torch.nn as nn

import rlstruct
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.compat import (
    DictTensor,
    GymEnv,
    RL_Agent,
    RL_Agent_CheckDevice,
    RL_Batcher,
    masked_tensor,
    replay_agent,
    replay_agent_stateless,
)
from rlstruct.errors import BatcherStateError, ConfigError

ENV_NAME = "rlstruct/Repeat-v0"
N_SYMBOLS = 2  # a uniform policy earns EPISODE_LENGTH / N_SYMBOLS per episode
EPISODE_LENGTH = 5


# ----------------------------------------------------------------- rlstructures-style code
def create_env(n_envs, env_name=None, seed=None):
    return GymEnv(
        env_name,
        n_envs=n_envs,
        seed=seed,
        make_kwargs={"n_symbols": N_SYMBOLS, "episode_length": EPISODE_LENGTH},
    )


def create_agent(model=None, n_actions=None):
    return ReinforceAgent(model=model, n_actions=n_actions)


class ReinforceAgent(RL_Agent):
    def __init__(self, model=None, n_actions=None):
        super().__init__()
        self.model = model
        self.n_actions = n_actions

    def update(self, state_dict):
        self.model.load_state_dict(state_dict)

    def seed(self, seed):
        torch.manual_seed(seed)

    def require_history(self):
        return False

    def initial_state(self, agent_info, B):  # noqa: N803 - rlstructures' name
        return DictTensor({})

    def __call__(self, state, observation, agent_info=None, history=None):
        assert state.empty()
        action_proba = self.model.action_model(observation["frame"])
        baseline = self.model.baseline_model(observation["frame"])
        dist = torch.distributions.Categorical(action_proba)
        action_sampled = dist.sample()

        action_max = action_proba.max(1)[1]
        smask = agent_info["stochastic"].float().to(action_max.device)
        action = masked_tensor(action_max, action_sampled, smask)

        new_state = DictTensor({})
        agent_do = DictTensor(
            {"action": action, "action_probabilities": action_proba, "baseline": baseline}
        )
        return agent_do, new_state


class Model(nn.Module):
    def __init__(self, action_model, baseline_model):
        super().__init__()
        self.action_model = action_model
        self.baseline_model = baseline_model


class ActionModel(nn.Module):
    def __init__(self, n_observations, n_actions, n_hidden):
        super().__init__()
        self.linear = nn.Linear(n_observations, n_hidden)
        self.linear2 = nn.Linear(n_hidden, n_actions)

    def forward(self, frame):
        z = torch.tanh(self.linear(frame))
        score_actions = self.linear2(z)
        return torch.softmax(score_actions, dim=-1)


class BaselineModel(nn.Module):
    def __init__(self, n_observations, n_hidden):
        super().__init__()
        self.linear = nn.Linear(n_observations, n_hidden)
        self.linear2 = nn.Linear(n_hidden, 1)

    def forward(self, frame):
        z = torch.tanh(self.linear(frame))
        return self.linear2(z)


def get_loss(agent, trajectories, discount_factor):
    replayed = replay_agent(agent, trajectories)
    trajectories = trajectories.trajectories

    reward = trajectories["_observation/reward"]
    mask = trajectories.mask()
    reward = reward * mask
    max_length = trajectories.lengths.max().item()
    cumulated_reward = torch.zeros_like(reward)
    cumulated_reward[:, max_length - 1] = reward[:, max_length - 1]
    for t in range(max_length - 2, -1, -1):
        cumulated_reward[:, t] = reward[:, t] + discount_factor * cumulated_reward[:, t + 1]

    action_probabilities = replayed["action_probabilities"]
    action_distribution = torch.distributions.Categorical(action_probabilities)
    baseline = replayed["baseline"].squeeze(-1)
    log_proba = action_distribution.log_prob(trajectories["action/action"])
    reinforce_loss = log_proba * (cumulated_reward - baseline).detach()
    reinforce_loss = (reinforce_loss * mask).sum(1) / mask.sum(1)

    entropy = action_distribution.entropy()
    entropy = (entropy * mask).sum(1) / mask.sum(1)

    baseline_loss = (baseline - cumulated_reward) ** 2
    baseline_loss = (baseline_loss * mask).sum(1) / mask.sum(1)

    return {
        "avg_reward": cumulated_reward[:, 0].mean(),
        "baseline_loss": baseline_loss.mean(),
        "reinforce_loss": reinforce_loss.mean(),
        "entropy_loss": entropy.mean(),
    }


# Spawned workers cannot import tests/: send this module's classes and functions by value.


def episode_returns(trajectories):
    reward = trajectories.trajectories["_observation/reward"]
    return (reward * trajectories.trajectories.mask()).sum(1)


# ----------------------------------------------------------------- the port runs and learns
@pytest.mark.timeout(180)
def test_rlstructures_style_reinforce_learns_on_repeat():
    torch.manual_seed(0)
    n_envs, n_processes, n_iterations = 4, 2, 15
    learning_model = Model(ActionModel(N_SYMBOLS, N_SYMBOLS, 16), BaselineModel(N_SYMBOLS, 16))
    agent = RL_Agent_CheckDevice(
        create_agent(model=learning_model, n_actions=N_SYMBOLS), torch.device("cpu")
    )
    train_batcher = RL_Batcher(
        EPISODE_LENGTH,
        create_agent,
        {"model": copy.deepcopy(learning_model), "n_actions": N_SYMBOLS},
        create_env,
        {"n_envs": n_envs, "env_name": ENV_NAME},
        n_processes,
        [0, 100],
        DictTensor({"stochastic": torch.tensor([True])}),
        DictTensor({}),
        [1, 2],
    )
    assert isinstance(train_batcher.batcher, Batcher)
    assert train_batcher.n_elems() == n_envs * n_processes
    optimizer = torch.optim.RMSprop(learning_model.parameters(), lr=0.01)
    returns, entropies = [], []
    try:
        train_batcher.update(learning_model.state_dict())
        for _ in range(n_iterations):
            n_episodes = n_envs * n_processes
            agent_info = DictTensor({"stochastic": torch.tensor([True]).repeat(n_episodes)})
            train_batcher.reset(agent_info=agent_info)
            train_batcher.execute()
            trajectories, n_env_running = train_batcher.get(blocking=True)
            assert n_env_running == 0
            assert trajectories.trajectories.lengths.eq(EPISODE_LENGTH).all()
            returns.append(episode_returns(trajectories).mean().item())

            dt = get_loss(agent, trajectories, discount_factor=0.9)
            entropies.append(dt["entropy_loss"].item())
            floss = 1.0 * dt["baseline_loss"] - 0.01 * dt["entropy_loss"] - dt["reinforce_loss"]
            optimizer.zero_grad()
            floss.backward()
            optimizer.step()
            train_batcher.update(learning_model.state_dict())

        # Greedy evaluation through agent_info, as rlstructures' examples did.
        greedy = DictTensor({"stochastic": torch.tensor([False]).repeat(n_envs * n_processes)})
        train_batcher.reset(agent_info=greedy)
        train_batcher.execute()
        evaluation, _ = train_batcher.get()
    finally:
        train_batcher.close()

    random_expectation = EPISODE_LENGTH / N_SYMBOLS
    final = sum(returns[-3:]) / 3
    assert returns[0] < random_expectation + 1.0, returns
    assert final > random_expectation + 0.3 * EPISODE_LENGTH, returns  # 4.0 of 5 vs 2.5
    assert entropies[-1] < entropies[0], entropies
    assert episode_returns(evaluation).min().item() == EPISODE_LENGTH


def test_rlstructures_style_replay_keyword_and_stateless_replay_agree():
    torch.manual_seed(0)
    model = Model(ActionModel(N_SYMBOLS, N_SYMBOLS, 8), BaselineModel(N_SYMBOLS, 8))
    batcher = RL_Batcher(
        EPISODE_LENGTH,
        create_agent,
        {"model": model, "n_actions": N_SYMBOLS},
        create_env,
        {"n_envs": 3, "env_name": ENV_NAME},
        1,
        [0],
        DictTensor({"stochastic": torch.tensor([True])}),
        DictTensor({}),
        device=torch.device("cpu"),
    )
    with batcher:
        batcher.reset()
        batcher.execute()
        trajectories, _ = batcher.get()
    agent = create_agent(model=model, n_actions=N_SYMBOLS)
    stepwise = replay_agent(agent, trajectories, replay_method_name="call_replay")
    flat = replay_agent_stateless(agent, trajectories, replay_method_name="call_replay")
    assert torch.allclose(
        stepwise["action_probabilities"], trajectories.trajectories["action/action_probabilities"]
    )
    # Actions are sampled again during replay; the deterministic outputs agree.
    probabilities = flat.get(["action_probabilities", "baseline"])
    assert probabilities.equal(stepwise.get(["action_probabilities", "baseline"]), atol=1e-6)


# ----------------------------------------------------------------- the mapping itself
class ZeroAgent(RL_Agent):
    """Action 0 on the device of the observation (runs on ``meta`` too)."""

    def __call__(self, state, input, agent_info=None, history=None):
        frame = input["frame"]
        return DictTensor({"action": frame.new_zeros(frame.shape[0], dtype=torch.long)}), state


def zero_batcher(n_processes, seeds, device="cpu", **kw):
    return RL_Batcher(
        3,
        ZeroAgent,
        {},
        create_env,
        {"n_envs": 2, "env_name": ENV_NAME},
        n_processes,
        seeds,
        DictTensor({}),
        DictTensor({}),
        None,
        device,
        **kw,
    )


def test_names_are_rlstructs_own():
    import rlstruct.compat as compat

    for name in ("DictTensor", "TemporalDictTensor", "Trajectories", "masked_tensor",
                 "masked_dicttensor"):
        assert getattr(compat, name) is getattr(rlstruct, name)
    for name in ("VecEnv", "GymEnv", "GymEnvInf", "DeviceEnv"):
        assert getattr(compat, name) is getattr(rlstruct.envs, name)
    assert compat.RL_Agent_CheckDevice is rlstruct.CheckDevice
    assert issubclass(compat.RL_Agent, rlstruct.Agent)
    assert sorted(compat.__all__) == sorted(set(compat.__all__))


def test_rl_agent_defaults():
    agent = RL_Agent()
    assert agent.initial_state(DictTensor({}), 3).n_elems() == 3
    assert agent.initial_state(DictTensor({}), 3).empty()
    assert not agent.require_history()
    with pytest.raises(NotImplementedError, match="RL_Agent must implement __call__"):
        agent(DictTensor({}), DictTensor({"frame": torch.zeros(3, 2)}))


def test_rl_agent_keeps_rlstructures_history_argument_which_rlstruct_calls_never_pass():
    seen = []

    class Echo(RL_Agent):
        def __call__(self, state, input, agent_info=None, history=None):
            seen.append(history)
            return DictTensor({"action": input["frame"].argmax(1)}), state

    obs = DictTensor({"frame": torch.eye(3)})
    for agent in (Echo(), RL_Agent_CheckDevice(Echo(), "cpu")):  # as the batchers call it
        action, _ = agent(DictTensor(batch_size=3), obs, DictTensor())
        assert action["action"].tolist() == [0, 1, 2]
    assert seen == [None, None]
    assert "history" not in inspect.signature(rlstruct.Agent.__call__).parameters


@pytest.mark.timeout(120)
def test_cpu_maps_to_a_multiprocess_batcher_with_rlstructures_methods():
    with zero_batcher(2, [0, 10]) as b:
        assert isinstance(b.batcher, Batcher) and b.batcher.n_processes == 2
        assert b.n_elems() == 4
        b.reset()
        b.execute()
        with pytest.raises(BatcherStateError, match="in flight"):
            b.execute()  # rlstructures would deadlock here
        deadline = time.monotonic() + 60
        while (result := b.get(blocking=False)) == (None, None):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        traj, n_running = result
        assert traj.n_elems() == 4 and n_running == 4
        assert traj.trajectories["action/action"].eq(0).all()
        # rlstructures' seeds: env k of process p gets seeds[p] + k.
        assert traj.info["env_id"].tolist() == [0, 1, 2, 3]
    b.close()  # idempotent


def test_non_cpu_device_maps_to_one_serial_batcher():
    # The meta device needs no GPU: construction and reset run, stepping would need real data.
    b = zero_batcher(1, [0], device="meta")
    assert isinstance(b.batcher, SerialBatcher)
    assert b.batcher.buffer.lengths.device == torch.device("meta")
    assert b.n_elems() == 2
    b.reset()
    b.close()


def test_unmappable_arguments_raise_config_errors():
    with pytest.raises(ConfigError, match=r"n_processes=2.*SerialBatcher.*n_processes=1"):
        zero_batcher(2, [0, 10], device="meta")
    with pytest.raises(ConfigError, match="store_agent_state"):
        zero_batcher(1, [0], store_agent_state=True)
    with pytest.raises(ConfigError, match="seeds has 1 entries, expected one per process"):
        zero_batcher(2, [0])
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="cuda"):
            zero_batcher(1, [0], device="cuda")


@pytest.mark.gpu
def test_cuda_device_collects_on_the_gpu():
    torch.manual_seed(0)
    model = Model(ActionModel(N_SYMBOLS, N_SYMBOLS, 8), BaselineModel(N_SYMBOLS, 8))
    with RL_Batcher(
        EPISODE_LENGTH,
        create_agent,
        {"model": model, "n_actions": N_SYMBOLS},
        create_env,
        {"n_envs": 4, "env_name": ENV_NAME},
        1,
        [0],
        DictTensor({"stochastic": torch.tensor([True])}),
        DictTensor({}),
        None,
        torch.device("cuda"),
    ) as b:
        assert isinstance(b.batcher, SerialBatcher)
        b.reset()
        b.execute()
        traj, _ = b.get()
    assert traj.device().type == "cuda"
    agent = RL_Agent_CheckDevice(create_agent(model=model.cuda(), n_actions=N_SYMBOLS), "cuda")
    replayed = replay_agent(agent, traj)
    assert replayed["action_probabilities"].device.type == "cuda"

"""Tests of the Agent base class and of the helper agents in tests/support/agents.py."""

from __future__ import annotations

import pickle

import pytest
import torch
from support.agents import DeterministicAgent, MLPAgent, RecurrentAgent, counter_observation
from torch import nn

from rlstruct.agent import Agent
from rlstruct.dicttensor import DictTensor
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories


class TwoModels(Agent):
    def __init__(self) -> None:
        self.policy = nn.Linear(2, 2)
        self.critic = nn.Linear(2, 1)


def same_parameters(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


# ---------------------------------------------------------------------------------- Agent base
def test_default_update_loads_a_state_dict():
    a, b = MLPAgent(init_seed=1), MLPAgent(init_seed=2)
    assert not same_parameters(a.model, b.model)
    b.update({k: v.clone() for k, v in a.model.state_dict().items()})
    assert same_parameters(a.model, b.model)


def test_update_with_two_modules_says_what_to_do():
    with pytest.raises(NotImplementedError, match=r"has 2 \(\['critic', 'policy'\]\); override"):
        TwoModels().update(TwoModels().policy.state_dict())
    with pytest.raises(NotImplementedError, match=r"has 0 \(\[\]\); override update"):
        DeterministicAgent().update({})


def test_to_moves_every_module_and_returns_self():
    agent = TwoModels()
    assert set(agent.modules()) == {"policy", "critic"}
    assert agent.to("meta") is agent
    for module in agent.modules().values():
        assert all(p.device.type == "meta" for p in module.parameters())


def test_update_loads_onto_the_module_device():
    a, b = MLPAgent(init_seed=1), MLPAgent(init_seed=2).to("meta")
    b.update(a.model.state_dict())  # a CPU state_dict into a module on another device
    assert b.model[0].weight.device.type == "meta"


def test_defaults():
    agent = Agent()
    state = agent.initial_state(DictTensor(), 5)
    assert state.empty() and state.n_elems() == 5
    assert not hasattr(agent, "require_history")  # history lives in rlstruct.compat only
    agent.seed(0)
    agent.close()
    with pytest.raises(NotImplementedError, match="Agent must implement __call__"):
        agent(state, DictTensor(), DictTensor())


def test_default_call_replay_feeds_step_t_and_agent_info():
    seen = {}

    class Spy(Agent):
        def __call__(self, state, observation, agent_info):
            seen.update(obs=observation, info=agent_info)
            return DictTensor({"action": observation["x"]}), state

    steps = TemporalDictTensor(
        {"observation/x": torch.arange(6).view(2, 3), "action/action": torch.zeros(2, 3)}
    )
    info = DictTensor({"agent_info/eps": torch.tensor([0.1, 0.2]), "env_id": torch.arange(2)})
    Spy().call_replay(Trajectories(info, steps), 1, DictTensor(batch_size=2))
    assert list(seen["obs"].keys()) == ["x"] and seen["obs"]["x"].tolist() == [1, 4]
    assert list(seen["info"].keys()) == ["eps"]


# ---------------------------------------------------------------------------------- helpers
def test_deterministic_agent_formula():
    obs = counter_observation(5, 4)
    action, state = DeterministicAgent(n_actions=4)(DictTensor(batch_size=4), obs, DictTensor())
    assert torch.equal(action["action"], obs["frame"].sum(-1) % 4)
    assert torch.equal(action["logits"].argmax(-1), action["action"])
    assert action["logits"].dtype == torch.float32 and state.empty()


def test_recurrent_agent_resets_and_remembers():
    agent = RecurrentAgent(n_actions=3, k=2)
    obs = counter_observation(1, 3)  # row 0 (L=2) and rows 1, 2 (L=3, 4) are mid-episode
    carried = DictTensor({"h": torch.ones(3, 2)})
    _, h1 = agent(carried, obs, DictTensor())
    x = obs["frame"].sum(-1, keepdim=True).float()
    assert torch.equal(h1["h"], torch.remainder(3 + x + torch.arange(2.0), 97))
    obs["initial_state"] = torch.tensor([True, False, True])
    _, h2 = agent(carried, obs, DictTensor())
    assert torch.equal(h2["h"][1], h1["h"][1])
    assert torch.equal(h2["h"][[0, 2]], torch.remainder(x[[0, 2]] + torch.arange(2.0), 97))


def test_mlp_agent_seeding_and_greedy():
    agent = MLPAgent(n_actions=3)
    obs = counter_observation(2, 64)
    state = DictTensor(batch_size=64)
    agent.seed(3)
    a1 = agent(state, obs, DictTensor())[0]
    a2 = agent(state, obs, DictTensor())[0]
    agent.seed(3)
    assert torch.equal(agent(state, obs, DictTensor())[0]["action"], a1["action"])
    assert not torch.equal(a1["action"], a2["action"])  # the stream advances
    greedy = torch.arange(64) % 2 == 0
    act = agent(state, obs, DictTensor({"greedy": greedy}))[0]
    assert torch.equal(act["action"][greedy], act["logits"].argmax(-1)[greedy])
    assert act["logits"].requires_grad


def test_mlp_agent_pickles_with_its_stream():
    agent = MLPAgent()
    obs, state = counter_observation(2, 16), DictTensor(batch_size=16)
    agent.seed(1)
    agent(state, obs, DictTensor())
    clone = pickle.loads(pickle.dumps(agent))
    assert torch.equal(
        clone(state, obs, DictTensor())[0]["action"], agent(state, obs, DictTensor())[0]["action"]
    )


@pytest.mark.gpu
def test_to_cuda_moves_modules():
    agent = MLPAgent().to("cuda")
    assert agent.model[0].weight.is_cuda
    action = agent(
        DictTensor(batch_size=4),
        counter_observation(0, 4, device="cuda"),
        DictTensor({"greedy": torch.ones(4, dtype=torch.bool)}),
    )[0]
    assert action["action"].is_cuda

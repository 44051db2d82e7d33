"""Tests of rlstruct.checks.CheckDevice: every breach is caught, nothing else changes."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from support.agents import (
    DeterministicAgent,
    MLPAgent,
    RecurrentAgent,
    collect_counter,
    counter_observation,
)

from rlstruct.agent import Agent
from rlstruct.agent_replay import replay_agent, replay_agent_stateless
from rlstruct.checks import CheckDevice
from rlstruct.dicttensor import DictTensor
from rlstruct.errors import DeviceContractError

META = torch.device("meta")
CPU = torch.device("cpu")
N = 3


class Recording(RecurrentAgent):
    """A recurrent agent that counts its calls (to prove checks fire before any compute)."""

    def __init__(self, out_device: str | None = None, state_device: str | None = None) -> None:
        super().__init__()
        self.n_calls = 0
        self.closed = False
        self.out_device, self.state_device = out_device, state_device
        self.custom_attribute = "forwarded"

    def __call__(self, state, observation, agent_info):
        self.n_calls += 1
        action, new_state = super().__call__(state, observation, agent_info)
        if self.out_device:
            action = action.to(self.out_device)
        if self.state_device:
            new_state = new_state.to(self.state_device)
        return action, new_state

    def custom_method(self, x: int) -> int:
        return x + 1

    def close(self) -> None:
        self.closed = True


def inputs(device="cpu"):
    agent = RecurrentAgent()
    return (
        agent.initial_state(DictTensor(), N).to(device),
        counter_observation(0, N).to(device),
        DictTensor({"eps": torch.zeros(N)}),
    )


def test_no_false_positive_when_everything_is_right():
    inner = Recording()
    agent = CheckDevice(inner, "cpu")
    state, obs, info = inputs()
    action, new_state = agent(state, obs, info)
    expected = RecurrentAgent()(state, obs, info)
    assert action.equal(expected[0]) and new_state.equal(expected[1])
    assert inner.n_calls == 1
    empties = CheckDevice(DeterministicAgent(), "meta")  # empty state and agent_info pass
    assert (
        empties(DictTensor(batch_size=N), counter_observation(0, N).to("meta"), DictTensor())[0][
            "action"
        ].device
        == META
    )
    assert agent.initial_state(info, N)["h"].shape == (N, 4)


def _raises(argument: str, key: str, expected: torch.device, actual: torch.device):
    return pytest.raises(
        DeviceContractError,
        match=rf"^{argument}\['{key}'\] is on {actual}, expected {expected} "
        rf"\(CheckDevice around Recording\)",
    )


def _check_attrs(err: DeviceContractError, argument, key, expected, actual) -> None:
    assert (err.argument, err.key, err.expected, err.actual) == (argument, key, expected, actual)


@pytest.mark.parametrize("argument", ["state", "observation", "agent_info"])
def test_input_breach_raises_before_the_agent_runs(argument):
    inner = Recording()
    agent = CheckDevice(inner, "cpu")
    state, obs, info = inputs()
    args = {"state": state, "observation": obs, "agent_info": info}
    args[argument] = args[argument].to("meta")
    key = {"state": "h", "observation": "frame", "agent_info": "eps"}[argument]
    with _raises(argument, key, CPU, META) as err:
        agent(args["state"], args["observation"], args["agent_info"])
    _check_attrs(err.value, argument, key, CPU, META)
    assert inner.n_calls == 0


def test_agent_info_must_be_on_cpu_even_when_device_matches():
    agent = CheckDevice(Recording(), "meta")
    state, obs, info = inputs("meta")
    with _raises("agent_info", "eps", CPU, META) as err:
        agent(state, obs, info.to("meta"))
    _check_attrs(err.value, "agent_info", "eps", CPU, META)


@pytest.mark.parametrize("argument", ["action", "new_state"])
def test_output_breach_raises(argument):
    inner = Recording(**{"out_device" if argument == "action" else "state_device": "meta"})
    agent = CheckDevice(inner, "cpu")
    key = "action" if argument == "action" else "h"
    with _raises(argument, key, CPU, META) as err:
        agent(*inputs())
    _check_attrs(err.value, argument, key, CPU, META)


def test_initial_state_breach_raises():
    inner = Recording().to("meta")
    with pytest.raises(DeviceContractError, match=r"^initial_state\['h'\] is on meta") as err:
        CheckDevice(inner, "cpu").initial_state(DictTensor(), N)
    _check_attrs(err.value, "initial_state", "h", CPU, META)


def test_expected_device_breach_reports_expected():
    with _raises("state", "h", META, CPU) as err:
        CheckDevice(Recording(), "meta")(*inputs())
    _check_attrs(err.value, "state", "h", META, CPU)


def test_trajectories_breach_in_replay():
    (traj,) = collect_counter(Recording(), n=N, n_steps=4)
    inner = Recording()
    agent = CheckDevice(inner, "cpu")
    meta = traj.to("meta")
    for call in (
        lambda: agent.call_replay(meta, 0, inner.initial_state(DictTensor(), N)),
        lambda: replay_agent(agent, meta),
        lambda: replay_agent_stateless(agent, meta),
    ):
        with _raises("trajectories", "observation/frame", CPU, META) as err:
            call()
        _check_attrs(err.value, "trajectories", "observation/frame", CPU, META)
    assert inner.n_calls == 0


def test_replay_through_the_wrapper_is_unchanged():
    (traj,) = collect_counter(RecurrentAgent(), n=N, n_steps=5)
    wrapped = replay_agent(CheckDevice(RecurrentAgent(), "cpu"), traj)
    assert wrapped.equal(replay_agent(RecurrentAgent(), traj))
    # agent_info comes from trajectories.info in replay: on the device, not a breach.
    (traj,) = collect_counter(
        DeterministicAgent(), n=N, n_steps=3, agent_info=DictTensor({"eps": torch.zeros(N)})
    )
    assert replay_agent_stateless(CheckDevice(DeterministicAgent(), "cpu"), traj).n_elems() == N


def test_replay_output_breach():
    (traj,) = collect_counter(RecurrentAgent(), n=N, n_steps=3)
    with _raises("action", "action", CPU, META):
        replay_agent(CheckDevice(Recording(out_device="meta"), "cpu"), traj)


def test_forwards_every_method_and_attribute():
    inner = Recording()
    agent = CheckDevice(inner, "cpu")
    assert isinstance(agent, Agent)
    assert agent.custom_attribute == "forwarded" and agent.custom_method(1) == 2
    assert agent.k == 4
    agent.k = 5  # setting goes to the wrapped agent
    assert inner.k == 5 and "k" not in vars(agent)
    agent.close()
    assert inner.closed
    assert agent.unwrapped is inner and CheckDevice(agent, "cpu").unwrapped is inner
    with pytest.raises(AttributeError, match="no_such_attribute"):
        agent.no_such_attribute  # noqa: B018


def test_forwards_seed_update_to_modules():
    a, b = MLPAgent(init_seed=1), MLPAgent(init_seed=2)
    wa, wb = CheckDevice(a, "cpu"), CheckDevice(b, "cpu")
    assert wa.modules() == {"model": a.model}
    wb.update(a.model.state_dict())
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    obs = counter_observation(3, 8)
    wa.seed(7)
    wb.seed(7)
    first = wa(DictTensor(batch_size=8), obs, DictTensor())[0]["action"]
    assert torch.equal(first, wb(DictTensor(batch_size=8), obs, DictTensor())[0]["action"])
    wa.seed(7)  # re-seeding through the wrapper restarts the stream
    assert torch.equal(first, wa(DictTensor(batch_size=8), obs, DictTensor())[0]["action"])
    assert wa.to("meta") is wa and a.model[0].weight.device == META
    assert wa.expected_device == META


def test_pickle_and_deepcopy_roundtrip():
    agent = CheckDevice(Recording(), "cpu")
    for clone in (pickle.loads(pickle.dumps(agent)), copy.deepcopy(agent)):
        assert isinstance(clone, CheckDevice) and clone.expected_device == CPU
        assert clone.custom_attribute == "forwarded"
        clone(*inputs())
        with pytest.raises(DeviceContractError):
            clone(*inputs("meta"))


@pytest.mark.gpu
def test_cuda_contract():
    agent = CheckDevice(RecurrentAgent().to("cuda"), "cuda")
    state, obs, info = inputs("cuda:0")
    action, new_state = agent(state, obs, info)  # "cuda" matches tensors on cuda:0
    assert action["action"].device.type == "cuda" and new_state["h"].is_cuda
    with pytest.raises(DeviceContractError, match=r"observation\['frame'\] is on cpu, expected"):
        agent(state, obs.to("cpu"), info)
    with pytest.raises(DeviceContractError, match=r"agent_info\['eps'\] is on cuda:0, expected cp"):
        agent(state, obs, info.to("cuda"))
    (traj,) = collect_counter(RecurrentAgent(), n=N, n_steps=4)
    with pytest.raises(DeviceContractError, match="trajectories"):
        replay_agent(agent, traj)
    on_gpu = replay_agent(agent, traj.to("cuda")).to("cpu")
    assert on_gpu.equal(replay_agent(RecurrentAgent(), traj))


@pytest.mark.gpu
def test_cuda_index_mismatch_is_caught():
    agent = CheckDevice(RecurrentAgent(), "cuda:1")
    with pytest.raises(DeviceContractError, match=r"state\['h'\] is on cuda:0, expected cuda:1"):
        agent(*inputs("cuda:0"))

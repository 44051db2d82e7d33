"""Tests of rlstruct.agent_replay: replay reproduces acquisition, carries state, keeps gradients."""

from __future__ import annotations

import pytest
import torch
from support.agents import DeterministicAgent, MLPAgent, RecurrentAgent, collect_counter

from rlstruct import keys as K
from rlstruct.agent import Agent
from rlstruct.agent_replay import replay_agent, replay_agent_stateless
from rlstruct.dicttensor import DictTensor
from rlstruct.errors import DeviceContractError, ShapeError
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories

RAGGED = torch.tensor([6, 4, 1, 0])
REPLAYS = [replay_agent, replay_agent_stateless]


def assert_reproduces(replayed: TemporalDictTensor, traj: Trajectories) -> None:
    """Every output equals the stored ``action/*`` on valid steps, bit for bit."""
    steps = traj.trajectories
    stored = {k[len(K.ACTION) :] for k in steps if k.startswith(K.ACTION)}
    assert set(replayed.keys()) == stored
    assert replayed.n_timesteps() == steps.n_timesteps()
    assert torch.equal(replayed.lengths, steps.lengths)
    mask = steps.mask()
    assert mask.any()
    for k in stored:
        assert torch.equal(replayed[k][mask], steps[K.ACTION + k][mask]), k


def eps_info(n: int) -> DictTensor:
    return DictTensor({"eps": torch.linspace(0, 1, n), "greedy": torch.arange(n) % 2 == 0})


@pytest.mark.parametrize("replay", REPLAYS)
def test_memoryless_replay_reproduces_acquisition(replay):
    agent = DeterministicAgent(n_actions=5)
    (traj,) = collect_counter(agent, n=4, n_steps=6, agent_info=eps_info(4), last_lengths=RAGGED)
    assert_reproduces(replay(DeterministicAgent(n_actions=5), traj), traj)


def test_stateless_is_one_call_and_equals_stepwise_even_on_padding():
    (traj,) = collect_counter(DeterministicAgent(), n=4, n_steps=6, last_lengths=RAGGED)
    stepwise, batched = DeterministicAgent(), DeterministicAgent()
    a, b = replay_agent(stepwise, traj), replay_agent_stateless(batched, traj)
    assert (stepwise.n_calls, batched.n_calls) == (6, 1)
    for k in a:
        assert torch.equal(a[k], b[k])


def test_stateless_flattens_rows_then_steps_and_repeats_info():
    seen = {}

    class Spy(Agent):
        def __call__(self, state, observation, agent_info):
            seen.update(state=state, obs=observation, info=agent_info)
            return DictTensor({"action": observation["x"]}), state

    x = torch.arange(6).view(2, 3)
    info = DictTensor(
        {"agent_info/eps": torch.tensor([0.5, 0.25]), "agent_state/h": torch.ones(2, 1)}
    )
    traj = Trajectories(info, TemporalDictTensor({"observation/x": x}, torch.tensor([3, 1])))
    out = replay_agent_stateless(Spy(), traj)
    assert seen["obs"]["x"].tolist() == [0, 1, 2, 3, 4, 5]
    assert seen["info"]["eps"].tolist() == [0.5] * 3 + [0.25] * 3
    assert seen["state"].empty() and seen["state"].n_elems() == 6
    assert torch.equal(out["action"], x)


def test_recurrent_replay_reproduces_acquisition():
    (traj,) = collect_counter(RecurrentAgent(), n=4, n_steps=7, last_lengths=RAGGED.clamp(max=7))
    assert_reproduces(replay_agent(RecurrentAgent(), traj), traj)
    # Without a stored state, replay starts from initial_state (zeros here: same result).
    no_state = Trajectories(traj.info.get([K.ENV_ID]), traj.trajectories)
    assert_reproduces(replay_agent(RecurrentAgent(), no_state), traj)


def test_recurrent_replay_continues_across_segments():
    first, second = collect_counter(
        RecurrentAgent(), n=4, n_steps=5, n_segments=2, last_lengths=torch.tensor([5, 3, 2, 0])
    )
    assert_reproduces(replay_agent(RecurrentAgent(), first), first)
    assert_reproduces(replay_agent(RecurrentAgent(), second), second)
    # The test can fail: restarting the second segment from a fresh state gets it wrong.
    fresh = Trajectories(second.info.get([K.ENV_ID]), second.trajectories)
    replayed = replay_agent(RecurrentAgent(), fresh)
    mask = second.trajectories.mask()
    assert not torch.equal(replayed["h_sum"][mask], second.trajectories["action/h_sum"][mask])


def test_replay_keeps_gradients():
    agent = MLPAgent(obs_dim=3, n_actions=3)
    (traj,) = collect_counter(agent, n=4, n_steps=6, last_lengths=RAGGED)
    steps = traj.trajectories
    mask = steps.mask()
    for replay in REPLAYS:
        agent.model.zero_grad()
        out = replay(agent, traj)
        assert out["logits"].requires_grad
        torch.testing.assert_close(out["logits"][mask], steps["action/logits"][mask])
        logp = torch.log_softmax(out["logits"], -1)
        logp = logp.gather(-1, steps["action/action"].unsqueeze(-1)).squeeze(-1)
        loss = -(logp * mask).sum() / mask.sum()
        loss.backward()
        for name, p in agent.model.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_custom_replay_method_and_bad_name():
    class Custom(DeterministicAgent):
        def my_replay(self, trajectories, t, state):
            out, state = self.call_replay(trajectories, t, state)
            return DictTensor({"twice": out["action"] * 2}), state

    (traj,) = collect_counter(Custom(), n=3, n_steps=4)
    for replay in REPLAYS:
        out = replay(Custom(), traj, method="my_replay")
        assert torch.equal(out["twice"], traj.trajectories["action/action"] * 2)
        with pytest.raises(AttributeError, match="no method 'no_such_method'"):
            replay(Custom(), traj, method="no_such_method")


class WrongRows(DeterministicAgent):
    """Drops a row at step ``bad_t``."""

    bad_t = 2

    def __call__(self, state, observation, agent_info):
        action, state = super().__call__(state, observation, agent_info)
        if self.n_calls - 1 == self.bad_t or observation.n_elems() > 4:
            action = action.slice(1, observation.n_elems())
        return action, state


def test_wrong_batch_size_names_t_and_key():
    (traj,) = collect_counter(DeterministicAgent(), n=4, n_steps=5)
    with pytest.raises(ShapeError, match=r"3 rows at t=2 \(key 'action'\), expected 4"):
        replay_agent(WrongRows(), traj)
    with pytest.raises(ShapeError, match=r"19 rows at B\*T rows \(key 'action'\), expected 20"):
        replay_agent_stateless(WrongRows(), traj)


def test_outputs_on_another_device_raise():
    class Elsewhere(DeterministicAgent):
        def __call__(self, state, observation, agent_info):
            action, state = super().__call__(state, observation, agent_info)
            return action.to("meta"), state

    (traj,) = collect_counter(DeterministicAgent(), n=2, n_steps=3)
    for replay in REPLAYS:
        with pytest.raises(DeviceContractError, match="on meta, expected cpu") as info:
            replay(Elsewhere(), traj)
        assert info.value.key == "action" and info.value.argument == "action"


@pytest.mark.parametrize("replay", REPLAYS)
def test_no_step_no_call(replay):
    steps = TemporalDictTensor(
        {"observation/frame": torch.zeros(2, 0, 3, dtype=torch.long)},
        torch.zeros(2, dtype=torch.long),
    )
    agent = DeterministicAgent()
    out = replay(agent, Trajectories(DictTensor(), steps))
    assert out.n_timesteps() == 0 and out.n_elems() == 2 and not list(out.keys())
    assert agent.n_calls == 0


@pytest.mark.gpu
@pytest.mark.parametrize("replay", REPLAYS)
def test_replay_on_cuda_matches_cpu(replay):
    agent = MLPAgent()
    (traj,) = collect_counter(agent, n=4, n_steps=6, last_lengths=RAGGED)
    cpu = replay(agent, traj)
    agent.to("cuda")
    gpu = replay(agent, traj.to("cuda"))
    assert gpu["logits"].device.type == "cuda" and gpu.lengths.device.type == "cuda"
    mask = traj.trajectories.mask()
    torch.testing.assert_close(gpu["logits"].cpu()[mask], cpu["logits"][mask])


# ----------------------------------------------------------------------------- transitions
def test_transitions_replay_in_one_call_and_equal_the_trajectory_replay():
    (traj,) = collect_counter(DeterministicAgent(), n=4, n_steps=6, last_lengths=RAGGED)
    transitions = traj.trajectories.to_transitions()  # the valid steps only, row by row
    agent = DeterministicAgent()
    out = replay_agent_stateless(agent, transitions)
    assert isinstance(out, DictTensor) and agent.n_calls == 1
    assert out.n_elems() == int(RAGGED.sum()) == transitions.n_elems()
    expected = replay_agent_stateless(DeterministicAgent(), traj).to_transitions()
    assert out.equal(expected)
    assert torch.equal(out["action"], transitions["action/action"])  # reproduces acquisition


def test_transitions_are_one_step_trajectories_with_an_empty_info():
    seen = {}

    class Spy(Agent):
        def call_replay(self, trajectories, t, state):
            seen.update(traj=trajectories, t=t, state=state)
            x = trajectories.trajectories["observation/x"][:, t]
            return DictTensor({"y": x * 2}), state

    x = torch.arange(5.0, requires_grad=True)
    out = replay_agent_stateless(Spy(), DictTensor({"observation/x": x}))
    assert seen["t"] == 0 and seen["traj"].lengths.tolist() == [1] * 5
    assert seen["traj"].trajectories.n_timesteps() == 1 and seen["traj"].info.empty()
    assert seen["state"].empty() and seen["state"].n_elems() == 5
    assert out["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0] and out["y"].requires_grad


def test_transitions_errors_name_the_culprit():
    (traj,) = collect_counter(DeterministicAgent(), n=4, n_steps=5)
    transitions = traj.trajectories.to_transitions()
    with pytest.raises(ShapeError, match=r"19 rows at N transitions \(key 'action'\), expected 20"):
        replay_agent_stateless(WrongRows(), transitions)

    class Elsewhere(DeterministicAgent):
        def __call__(self, state, observation, agent_info):
            action, state = super().__call__(state, observation, agent_info)
            return action.to("meta"), state

    with pytest.raises(DeviceContractError, match="on meta, expected cpu"):
        replay_agent_stateless(Elsewhere(), transitions)
    empty = replay_agent_stateless(DeterministicAgent(), DictTensor(batch_size=0))
    assert empty.n_elems() == 0 and empty.empty()

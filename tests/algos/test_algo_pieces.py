"""The small pieces every algorithm shares, now in the library: the composite trajectory keys,
greedy evaluation's agent_info, advantage normalisation, a categorical policy's log-probability
and entropy, the fused-Adam choice, ``ActorAgent``'s replay, and ``Run.publish``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlstruct import Agent, DictTensor, TemporalDictTensor, Trajectories, replay_agent_stateless
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.blocks.nets import MLPActorCritic
from rlstruct.blocks.optim import adam
from rlstruct.blocks.sampling import GREEDY, ActorAgent, CategoricalSampler, greedy_info
from rlstruct.envs import GymEnvInf
from rlstruct.errors import ConfigError, ShapeError
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.run import Run, RunConfig


# ----------------------------------------------------------------------------- keys
def test_composite_keys_are_prefix_plus_leaf():
    assert (K.OBS_FRAME, K.OBS_INITIAL_STATE) == ("observation/frame", "observation/initial_state")
    assert (K.NEXT_FRAME, K.NEXT_REWARD) == ("_observation/frame", "_observation/reward")
    assert (K.NEXT_TERMINATED, K.NEXT_TRUNCATED) == (
        "_observation/terminated", "_observation/truncated")
    assert (K.STORED_ACTION, K.STORED_LOGP, K.STORED_VALUE) == (
        "action/action", "action/logp", "action/value")


# ----------------------------------------------------------------------------- greedy
def test_greedy_info_is_a_fresh_one_row_flag_that_the_sampler_obeys_on_every_row():
    info = greedy_info()
    assert info.n_elems() == 1 and info[GREEDY].dtype == torch.bool and bool(info[GREEDY])
    info[GREEDY][0] = False  # a caller that edits its copy does not change the next one
    assert bool(greedy_info()[GREEDY])
    logits = torch.tensor([[0.0, 0.1, 0.0]] * 64)  # near uniform: sampling would vary
    sample = CategoricalSampler()
    assert sample(logits, greedy_info()).eq(1).all()
    assert not sample(logits, DictTensor()).eq(1).all()


# ----------------------------------------------------------------------------- normalisation
def test_normalize_advantages_uses_only_the_valid_steps():
    x = torch.tensor([[1.0, 2.0, 3.0, float("nan")], [4.0, 5.0, 1e9, float("inf")]])
    mask = F.valid_mask(torch.tensor([3, 2]), 4)
    valid = x[mask]
    expected = (x - valid.mean()) / (valid.std(correction=0) + 1e-8)
    out = F.normalize_advantages(x, mask)
    torch.testing.assert_close(out[mask], expected[mask])
    assert out[mask].mean().abs() < 1e-6 and (out[mask].std(correction=0) - 1).abs() < 1e-5


def test_normalize_advantages_without_a_mask_and_its_epsilon():
    x = torch.randn(100) * 50 + 3
    torch.testing.assert_close(F.normalize_advantages(x), (x - x.mean()) / (x.std(correction=0)
                                                                          + 1e-8))
    assert F.normalize_advantages(torch.full((5,), 7.0)).abs().max() == 0  # constant: zeros
    torch.testing.assert_close(F.normalize_advantages(torch.tensor([0.0, 2.0]), eps=1.0),
                               torch.tensor([-0.5, 0.5]))
    with pytest.raises(ConfigError, match="eps must be >= 0, got -1"):
        F.normalize_advantages(x, eps=-1)
    with pytest.raises(ShapeError, match="mask has shape"):
        F.normalize_advantages(x, torch.ones(3, dtype=torch.bool))


def test_normalize_advantages_passes_gradients():
    x = torch.tensor([1.0, 2.0, 4.0], requires_grad=True)
    F.normalize_advantages(x, torch.tensor([True, True, False]))[0].backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad[2] == 0


# ----------------------------------------------------------------------------- categorical
def test_categorical_log_prob_and_entropy_match_torch_distributions():
    logits = torch.randn(3, 5, 4)
    action = torch.randint(4, (3, 5))
    dist = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(F.categorical_log_prob(logits, action), dist.log_prob(action))
    torch.testing.assert_close(F.categorical_entropy(logits), dist.entropy())
    log_probs = logits.log_softmax(-1)  # log-probabilities give the same answers
    torch.testing.assert_close(F.categorical_entropy(log_probs), dist.entropy())


def test_categorical_entropy_of_masked_actions_is_finite_with_finite_gradients():
    logits = torch.tensor([[1.0, -float("inf"), 0.0], [-float("inf"), 0.0, -float("inf")]],
                          requires_grad=True)
    entropy = F.categorical_entropy(logits)
    expected = torch.distributions.Categorical(logits=torch.tensor([1.0, 0.0])).entropy()
    torch.testing.assert_close(entropy, torch.stack([expected, torch.tensor(0.0)]))
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()


# ----------------------------------------------------------------------------- optimizer
def test_adam_is_fused_where_the_device_allows_it():
    w = torch.nn.Parameter(torch.ones(3))
    cpu = adam([w], lr=0.1, device="cpu", eps=1e-5)
    assert isinstance(cpu, torch.optim.Adam) and cpu.defaults["fused"] is True
    assert cpu.defaults["lr"] == 0.1 and cpu.defaults["eps"] == 1e-5
    meta = adam([torch.nn.Parameter(torch.ones(3, device="meta"))], 0.1, torch.device("meta"))
    assert not meta.defaults["fused"]
    with pytest.raises(ConfigError, match="not a device spec"):
        adam([w], 0.1, "cpux")


# ----------------------------------------------------------------------------- ActorAgent replay
def test_actor_agent_replays_logits_and_values_with_gradients_and_next_value_without():
    torch.manual_seed(0)
    model = MLPActorCritic(3, 2, 8)
    frame, next_frame = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    steps = TemporalDictTensor({K.OBS_FRAME: frame, K.NEXT_FRAME: next_frame},
                               torch.tensor([4, 2]))
    traj = Trajectories(DictTensor(batch_size=2), steps)
    out = replay_agent_stateless(ActorAgent(model, replay_next_value=True), traj)
    logits, value = model(frame.flatten(0, 1))
    torch.testing.assert_close(out["logits"], logits.view(2, 4, 2))
    torch.testing.assert_close(out[K.VALUE], value.view(2, 4))
    torch.testing.assert_close(out["next_value"], model(next_frame.flatten(0, 1))[1].view(2, 4))
    assert out["logits"].requires_grad and out[K.VALUE].requires_grad
    assert not out["next_value"].requires_grad
    plain = replay_agent_stateless(ActorAgent(model), traj)  # PPO's: no next_value
    assert set(plain.keys()) == {"logits", K.VALUE}


# ----------------------------------------------------------------------------- Run.publish
class _Recorder:
    """What publish may touch on a batcher: ``update``, ``execute`` and ``pipeline``."""

    def __init__(self, pipeline: int) -> None:
        self.pipeline, self.calls = pipeline, []

    def update(self, weights) -> None:
        self.calls.append(("update", weights))

    def execute(self, agent_info=None) -> None:
        self.calls.append(("execute", agent_info))


def _run(tmp_path: Path) -> Run:
    layout = LayoutConfig(learner_device="cpu", n_processes=1, n_envs=2)
    return Run("test", RunConfig(env_id="rlstruct/Repeat-v0", layout=layout, eval_every=0,
                                 runs_dir=str(tmp_path)))


def test_publish_updates_then_executes_a_synchronous_batcher_with_the_agent_info(tmp_path):
    eps = DictTensor({"epsilon": torch.tensor([0.1, 0.2])})
    with _run(tmp_path) as run:
        sync, pipelined = _Recorder(1), _Recorder(2)
        run.publish(sync, {"w": 1}, agent_info=eps)
        run.publish(sync, {"w": 2})
        run.publish(pipelined, {"w": 3})
        assert sync.calls == [("update", {"w": 1}), ("execute", eps), ("update", {"w": 2}),
                              ("execute", None)]
        assert pipelined.calls == [("update", {"w": 3})]  # already collecting: no execute
        with pytest.raises(ConfigError, match=r"agent_info=.*synchronous batcher.*pipeline=2"):
            run.publish(pipelined, {"w": 4}, agent_info=eps)
        assert pipelined.calls == [("update", {"w": 3})]  # refused before anything changed


class _EchoEpsilon(Agent):
    """Acts 0 and stores the epsilon of its row (as DQN's agent reads it)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, state, observation, agent_info):
        n = observation.n_elems()
        return DictTensor({K.ACTION_KEY: torch.zeros(n, dtype=torch.long),
                           "epsilon": agent_info["epsilon"].clone()}), state


def test_publish_hands_per_row_agent_info_to_a_real_batcher(tmp_path):
    with _run(tmp_path) as run:
        model = torch.nn.Linear(2, 2)
        batcher = run.training_batcher(_EchoEpsilon, {"model": model}, GymEnvInf, 3,
                                       agent_info=DictTensor({"epsilon": torch.ones(1)}),
                                       pipelined=False)
        segments = run.segments(batcher, agent_info=DictTensor({"epsilon": torch.ones(1)}))
        first = next(segments)
        assert first.trajectories[K.ACTION + "epsilon"].eq(1).all()
        run.publish(batcher, model.state_dict(),
                    agent_info=DictTensor({"epsilon": torch.tensor([0.25, 0.5])}))
        second = next(segments)
        stored = second.trajectories[K.ACTION + "epsilon"]
        assert stored[0].eq(0.25).all() and stored[1].eq(0.5).all()
        assert second.info[K.POLICY_VERSION].eq(1).all()  # the update came with it
        segments.close()

"""--precision: rlstruct.devices.learner_autocast, the Nature CNN's float32 heads under bfloat16,
and the learn step of a learner group in bfloat16 (rlstruct.learners.rank.algorithm_learn)."""

from __future__ import annotations

import contextlib
from functools import partial

import pytest
import torch

from rlstruct.algos import ppo
from rlstruct.blocks.nets import CNNActorCritic
from rlstruct.devices import bf16_native, learner_autocast
from rlstruct.errors import ConfigError
from rlstruct.learners.rank import RankContext, algorithm_learn


def test_learner_autocast_by_precision():
    assert isinstance(learner_autocast("cpu", "fp32"), contextlib.nullcontext)
    assert isinstance(learner_autocast("cpu", "bf16"), torch.autocast)
    auto = learner_autocast("cpu", "auto")
    assert isinstance(auto, torch.autocast) == bf16_native("cpu")
    with pytest.raises(ConfigError, match="precision must be 'fp32', 'bf16' or 'auto', got 'fp16'"):
        learner_autocast("cpu", "fp16")
    assert ppo.Config(precision="fp16").problems() == [  # type: ignore[arg-type]
        "precision must be fp32, bf16 or auto, got 'fp16'"]


def test_each_forward_in_one_bf16_learn_step_sees_the_updated_weights():
    """A learn step is many optimizer steps inside one ``learner_autocast`` context. With
    autocast's cast cache, every forward of it reused the bfloat16 copies of the weights from
    its first one: PPO's Nature CNN then learned 16 minibatches on stale weights and did not
    learn Pong."""
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(64, 64), torch.randn(8, 64)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    with learner_autocast("cpu", "bf16"):
        before = layer(x)
        before.square().mean().backward()
        opt.step()
        after = layer(x)
        with torch.autocast("cpu", enabled=False):
            expected = torch.nn.functional.linear(x.bfloat16(), layer.weight.bfloat16(),
                                                  layer.bias.bfloat16())
    assert after.dtype == torch.bfloat16
    assert not torch.equal(after, before.detach())
    torch.testing.assert_close(after.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_a_bf16_ppo_learn_moves_the_cnn_policy_as_much_as_fp32():
    """One PPO learn (4 epochs of 4 minibatches) from the same weights on the same random
    batch: the policy's KL to where it started is bf16's within 20 % of fp32's (with the cast
    cache it was 7x fp32's, the trunk stepping 16 times along one stale gradient)."""
    from rlstruct import DictTensor, TemporalDictTensor, Trajectories
    from rlstruct import keys as K
    from rlstruct.blocks.optim import adam
    from rlstruct.blocks.sampling import PolicyAgent

    torch.manual_seed(0)
    model, b, t = CNNActorCritic(6), 4, 64
    frames = torch.randint(0, 255, (b, t, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        logits, value = model(frames.flatten(0, 1))
    start = logits.log_softmax(-1)
    action = torch.distributions.Categorical(logits=logits).sample()
    steps = {
        K.OBS_FRAME: frames, K.NEXT_FRAME: frames, K.STORED_SAMPLE: action.view(b, t),
        K.STORED_LOGP: start.gather(1, action[:, None]).view(b, t),
        K.STORED_VALUE: value.view(b, t),
        K.NEXT_REWARD: torch.randn(b, t), K.NEXT_TERMINATED: torch.zeros(b, t, dtype=torch.bool),
        K.NEXT_TRUNCATED: torch.zeros(b, t, dtype=torch.bool)}
    cfg = ppo.Config.from_preset("atari", minibatch_size=64)
    moved = {}
    for precision in ("fp32", "bf16"):
        replica = CNNActorCritic(6)
        replica.load_state_dict(model.state_dict())
        optimizer = adam(replica.parameters(), lr=2.5e-4, device="cpu", eps=1e-5)
        traj = Trajectories(DictTensor(), TemporalDictTensor(
            {k: v.clone() for k, v in steps.items()}, torch.full((b,), t)))
        torch.manual_seed(1)
        with learner_autocast("cpu", precision):
            ppo.learn(PolicyAgent(replica), optimizer, traj, cfg)
        with torch.no_grad():
            new = replica(frames.flatten(0, 1))[0].log_softmax(-1)
        moved[precision] = float((start.exp() * (start - new)).sum(-1).mean())
    assert moved["fp32"] > 0
    assert abs(moved["bf16"] / moved["fp32"] - 1) < 0.2, moved


def test_the_cnn_trunk_runs_in_bf16_and_its_heads_in_float32():
    torch.manual_seed(0)
    model = CNNActorCritic(6)
    frames = torch.randint(0, 255, (8, 4, 84, 84), dtype=torch.uint8)
    trunk_dtypes = []
    model.trunk.register_forward_hook(lambda m, i, o: trunk_dtypes.append(o.dtype))
    with learner_autocast("cpu", "bf16"):
        logits, value = model(frames)
        only_value = model.value(frames)
    assert trunk_dtypes == [torch.bfloat16, torch.bfloat16]
    assert logits.dtype == value.dtype == only_value.dtype == torch.float32
    ref_logits, ref_value = model(frames)
    # float32 heads on bfloat16 features: close to float32 throughout (bf16 has 8 bits of
    # mantissa; the log-ratio of a policy to itself stays far inside PPO's clip of 0.1)
    logp = torch.log_softmax(logits, -1) - torch.log_softmax(ref_logits, -1)
    assert logp.abs().max() < 0.02
    torch.testing.assert_close(value, ref_value, atol=0.05, rtol=0.05)


def test_a_learn_step_in_bf16_trains_and_keeps_float32_weights():
    torch.manual_seed(0)
    model = CNNActorCritic(6)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    ctx = RankContext(0, 1, torch.device("cpu"), model, opt)
    frames = torch.randint(0, 255, (16, 4, 84, 84), dtype=torch.uint8)
    seen = []

    def learn(agent, optimizer, batch, cfg, step):
        seen.append(torch.is_autocast_enabled("cpu"))
        logits, value = agent(batch)
        loss = logits.logsumexp(-1).mean() + value.square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return {"loss": float(loss.detach())}

    before = model.trunk[0].weight.detach().clone()
    step = partial(algorithm_learn, learn=learn, make_agent=None, cfg=None)
    step(ctx, frames, precision="bf16")
    step(ctx, frames, precision="fp32")
    assert seen == [True, False] and not torch.is_autocast_enabled("cpu")
    assert model.trunk[0].weight.dtype == torch.float32
    assert not model.trunk[0].weight.equal(before)

"""--precision: rlstruct.devices.learner_autocast, the Nature CNN's float32 heads under bfloat16,
and the learn step of a learner group in bfloat16 (rlstruct.learners.rank.algorithm_learn)."""

from __future__ import annotations

import contextlib
from functools import partial

import pytest
import torch

from rlstruct.algos import ppo
from rlstruct.devices import bf16_native, learner_autocast
from rlstruct.errors import ConfigError
from rlstruct.learn.nets import CNNActorCritic
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

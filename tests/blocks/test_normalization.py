"""RunningNorm (rlstruct.blocks.normalization): numpy's mean and variance over the stream, the
statistics in the state_dict (so batcher.update and checkpoints carry them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlstruct.blocks.distributions import make_head
from rlstruct.blocks.nets import HeadActorCritic
from rlstruct.blocks.normalization import RunningNorm
from rlstruct.errors import ConfigError, ShapeError


def test_statistics_equal_numpys_over_the_stream():
    rng = np.random.default_rng(0)
    norm = RunningNorm((3,))
    seen = []
    for n in (1, 7, 0, 250, 3, 1000):  # uneven batches, an empty one among them
        x = rng.normal([5.0, -3.0, 1e3], [0.1, 4.0, 50.0], size=(n, 3)).astype(np.float32)
        norm.update(torch.from_numpy(x))
        seen.append(x)
        stream = np.concatenate(seen).astype(np.float64)
        np.testing.assert_allclose(norm.mean.numpy(), stream.mean(0), rtol=1e-12, atol=1e-9)
        if len(stream) > 1:
            np.testing.assert_allclose(norm.var.numpy(), stream.var(0), rtol=1e-9)
        assert int(norm.count) == len(stream)
    x = torch.from_numpy(seen[-1][:5])
    mean, var = torch.from_numpy(stream.mean(0)), torch.from_numpy(stream.var(0))
    expected = (x.double() - mean) / (var + 1e-8).sqrt()
    torch.testing.assert_close(norm(x), expected.float())


def test_forward_clips_and_never_updates():
    norm = RunningNorm(2, clip=5.0)
    norm.update(torch.tensor([[0.0, 0.0], [2.0, 2.0]]))
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    y = norm(torch.tensor([[1e6, -1e6]]))
    assert y.tolist() == [[5.0, -5.0]]
    for k, v in norm.state_dict().items():
        assert torch.equal(v, before[k])


def test_feature_shapes_and_errors():
    norm = RunningNorm((2, 3))
    norm.update(torch.ones(4, 2, 3))
    assert norm(torch.ones(1, 2, 3)).shape == (1, 2, 3)
    with pytest.raises(ShapeError, match=r"expected \(N, \*\(2, 3\)\)"):
        norm.update(torch.ones(4, 6))
    with pytest.raises(ConfigError, match="eps > 0"):
        RunningNorm(2, eps=0.0)


def test_the_statistics_travel_with_the_weights():
    """What batcher.update and the checkpoint get is model.state_dict(): it must hold them, and
    loading it into a worker's copy makes the copy normalise alike."""
    import gymnasium as gym

    space = gym.spaces.Box(-1.0, 1.0, (1,))
    learner = HeadActorCritic(3, make_head(space, 16), 16, normalize_obs=True)
    worker = HeadActorCritic(3, make_head(space, 16), 16, normalize_obs=True)
    learner.obs_norm.update(torch.randn(100, 3) * 3 + 1)
    state = learner.state_dict()
    assert {"obs_norm.mean", "obs_norm.var", "obs_norm.count"} <= set(state)
    worker.load_state_dict(state)
    frame = torch.randn(4, 3)
    for a, b in zip(learner(frame), worker(frame)):
        assert torch.equal(a, b)
    assert state["obs_norm.mean"].dtype == torch.float64  # not rounded on the way


def test_scale_rewards_divides_by_the_std_of_running_discounted_returns():
    from rlstruct.blocks.normalization import scale_rewards

    gamma = 0.9
    reward = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]])
    done = torch.tensor([[False, True, False, False], [False, False, False, False]])
    lengths = torch.tensor([4, 3])  # row 1's last step is not valid
    norm = RunningNorm((1,), clip=0.0)
    scaled, running = scale_rewards(norm, torch.tensor([10.0, 0.0]), reward, done, lengths,
                                    gamma, clip=100.0)
    # by hand: row 0 continues from 10, restarts after step 1; row 1 stops after 3 steps
    r0 = [10 * 0.9 + 1, (10 * 0.9 + 1) * 0.9 + 2, 3.0, 3 * 0.9 + 4]
    r1 = [0.5, 0.5 * 0.9 - 1, (0.5 * 0.9 - 1) * 0.9 + 2]
    returns = torch.tensor(r0 + r1, dtype=torch.float64)
    torch.testing.assert_close(norm.var, returns.var(correction=0).reshape(1))
    assert int(norm.count) == 7
    torch.testing.assert_close(scaled, reward / returns.var(correction=0).sqrt().float())
    torch.testing.assert_close(running, torch.tensor([r0[-1], r1[-1]]))
    clipped, _ = scale_rewards(RunningNorm((1,), clip=0.0), None, reward, done, lengths, gamma,
                               clip=1.0)
    assert clipped.abs().max() == 1.0 and (clipped.abs() < 1.0).any()

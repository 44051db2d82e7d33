"""rlstruct/algos/reinforce.py: known-answer tests of the loss pieces, smoke runs, a short
learning test."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from gymnasium.spaces import Discrete
from support.algo_runs import check_run_dir, evaluated_rows, run_algo
from support.trajectory_builders import steps

from rlstruct import DictTensor, Trajectories, replay_agent_stateless
from rlstruct.algos import reinforce
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.zoo import actor_critic
from rlstruct.runs.layout import LayoutConfig


# ----------------------------------------------------------------------------- loss pieces
def test_episode_returns_stop_at_termination_and_bootstrap_truncation_and_cuts():
    # row 0 terminates at t=2; row 1 is truncated at t=1 (then padding); row 2 is cut at t=2.
    reward = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 9.0], [0.0, 0.0, 1.0]])
    terminated = torch.tensor([[False, False, True], [False, False, False], [False] * 3])
    truncated = torch.tensor([[False] * 3, [False, True, False], [False] * 3])
    next_value = torch.tensor([[100.0, 100.0, 100.0], [100.0, 4.0, 100.0], [100.0, 100.0, 10.0]])
    traj = Trajectories(
        DictTensor(),
        steps([3, 2, 3], reward=reward, terminated=terminated, truncated=truncated),
    )
    returns = reinforce.episode_returns(traj, next_value, gamma=0.5)
    expected = torch.tensor(
        [
            [1 + 0.5 * (2 + 0.5 * 3), 2 + 0.5 * 3, 3.0],  # no bootstrap after termination
            [1 + 0.5 * (1 + 0.5 * 4), 1 + 0.5 * 4, 0.0],  # V(true final obs) = 4; padding 0
            [0.5 * 0.5 * (1 + 0.5 * 10), 0.5 * (1 + 0.5 * 10), 1 + 0.5 * 10],  # cut: V = 10
        ]
    )
    torch.testing.assert_close(returns, expected)


def _loss_by_loops(logp, entropy, value, returns, lengths, vf_coef, ent_coef, norm):
    """The loss written with plain Python loops over the valid steps."""
    valid = [(b, t) for b in range(len(lengths)) for t in range(lengths[b])]
    adv = [float(returns[b, t] - value[b, t]) for b, t in valid]
    if norm:
        mean = sum(adv) / len(adv)
        std = math.sqrt(sum((a - mean) ** 2 for a in adv) / len(adv))
        adv = [(a - mean) / (std + 1e-8) for a in adv]
    n = len(valid)
    policy = -sum(float(logp[b, t]) * a for (b, t), a in zip(valid, adv)) / n
    value_loss = sum(float(value[b, t] - returns[b, t]) ** 2 for b, t in valid) / n
    ent = sum(float(entropy[b, t]) for b, t in valid) / n
    return policy + vf_coef * value_loss - ent_coef * ent, policy, value_loss, ent


@pytest.mark.parametrize("norm", [True, False])
def test_reinforce_loss_matches_a_python_loop_and_ignores_padding(norm):
    g = torch.Generator().manual_seed(0)
    logp, entropy, value, returns = (torch.randn(2, 4, generator=g) for _ in range(4))
    lengths = [4, 2]
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    for x in (logp, entropy, value, returns):
        x[~mask] = 1e6  # padding garbage must never leak into the loss
    value.requires_grad_(True)
    loss, stats = reinforce.reinforce_loss(
        logp, entropy, value, returns, mask, vf_coef=0.5, ent_coef=0.01, normalize_advantages=norm
    )
    exp_loss, exp_policy, exp_value, exp_ent = _loss_by_loops(
        logp, entropy, value.detach(), returns, lengths, 0.5, 0.01, norm
    )
    assert loss.item() == pytest.approx(exp_loss, rel=1e-5)
    assert stats["policy_loss"] == pytest.approx(exp_policy, rel=1e-5)
    assert stats["value_loss"] == pytest.approx(exp_value, rel=1e-5)
    assert stats["entropy"] == pytest.approx(exp_ent, rel=1e-5)
    # The advantage is detached: V gets only the baseline's MSE gradient, vf_coef * 2 (V - G) / n.
    loss.backward()
    expected_grad = torch.where(mask, 0.5 * 2 * (value.detach() - returns) / 6, 0.0)
    torch.testing.assert_close(value.grad, expected_grad)


def _model(n_actions: int) -> torch.nn.Module:
    """The zoo's ``--model mlp`` (what reinforce.main builds) for 3-d observations."""
    return actor_critic("mlp", (3,), space_spec(Discrete(n_actions)), 8)


def test_replay_gives_logp_entropy_and_values_of_the_stored_steps():
    model = _model(n_actions=2)
    with torch.no_grad():  # a uniform policy: logp = -ln 2, entropy = ln 2
        model.head.logits.weight.zero_()
        model.head.logits.bias.zero_()
    frame, next_frame = torch.randn(2, 3, 3), torch.randn(2, 3, 3)
    action = torch.tensor([[0, 1, 1], [1, 0, 0]])
    traj = Trajectories(
        DictTensor(), steps([3, 1], frame=frame, next_frame=next_frame, action=action)
    )
    out = replay_agent_stateless(reinforce.PolicyAgent(model), traj)
    torch.testing.assert_close(out["logp"], torch.full((2, 3), -math.log(2)))
    torch.testing.assert_close(out["entropy"], torch.full((2, 3), math.log(2)))
    value = model.critic(frame.flatten(0, 1)).view(2, 3)
    torch.testing.assert_close(out["value"], value)
    torch.testing.assert_close(out["next_value"], model.critic(next_frame.flatten(0, 1)).view(2, 3))
    assert out["value"].requires_grad and not out["next_value"].requires_grad


def test_agent_samples_reproducibly_and_acts_greedily_on_request():
    model = _model(n_actions=4)
    obs = DictTensor({"frame": torch.randn(64, 3)})
    state = DictTensor(batch_size=64)
    a, b = reinforce.PolicyAgent(model), reinforce.PolicyAgent(model)
    a.seed(7)
    b.seed(7)
    first = a(state, obs, DictTensor())[0]["action"]
    assert first.equal(b(state, obs, DictTensor())[0]["action"])
    greedy = DictTensor({"greedy": torch.ones(64, dtype=torch.bool)})
    assert a(state, obs, greedy)[0]["action"].equal(model.actor(obs["frame"]).argmax(-1))


# ----------------------------------------------------------------------------- runs
SMOKE = ["--max-frames", "2000", "--n-envs", "2", "--eval-every", "1", "--seed", "0"]


def layout(**kw) -> LayoutConfig:
    return LayoutConfig(**{"learner_device": "cpu", "n_processes": 1, "n_envs": 2, **kw})


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_smoke_run_from_another_folder_writes_a_complete_run_dir(tmp_path):
    run_dir, stdout = run_algo("reinforce", SMOKE, cwd=tmp_path)  # 2 worker processes
    rows = check_run_dir(run_dir)
    assert int(rows[-1]["frames"]) >= 2000 and "reinforce: stopped by max_frames" in stdout
    assert evaluated_rows(rows)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_check_devices_smoke_run(tmp_path):
    run_dir, _ = run_algo("reinforce", [*SMOKE, "--check-devices"], cwd=tmp_path)
    check_run_dir(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_shorter_segments_than_episodes(tmp_path):
    # T=8 < episode length: execute/get until no env runs, each cut bootstraps from V.
    cfg = reinforce.Config(layout=layout(), n_timesteps=8, max_frames=500, eval_every=1,
                           eval_envs=2, runs_dir=str(tmp_path))
    summary = reinforce.main(cfg)
    rows = check_run_dir(Path(summary["run_dir"]))
    assert summary["frames"] >= 500 and summary["episodes"] == int(rows[-1]["episodes"]) > 0


@pytest.mark.slow
def test_learns_the_repeat_env(tmp_path):
    # Reward 1 per step for repeating the observed symbol: random play earns 5 of 10.
    cfg = reinforce.Config(
        env_id="rlstruct/Repeat-v0", layout=layout(n_envs=16), lr=1e-2, eval_every=0,
        target_return=9.5, max_frames=100_000, time_budget=50, runs_dir=str(tmp_path),
    )
    summary = reinforce.main(cfg)
    assert summary["train_return_mean20"] >= 8.0, summary


@pytest.mark.gpu
def test_gpu_layout(tmp_path):
    cfg = reinforce.Config(
        layout=LayoutConfig(learner_device="cuda:0", batcher_device="cuda", eval_device="cpu",
                            n_envs=4, check_devices=True),
        max_frames=2000, eval_every=1, runs_dir=str(tmp_path),
    )
    check_run_dir(Path(reinforce.main(cfg)["run_dir"]))


def test_the_cnn_is_refused_for_flat_observations_before_a_run_folder_exists(tmp_path):
    from rlstruct.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--model cnn takes image frames .* \(4,\)"):
        reinforce.main(reinforce.Config(model="cnn", runs_dir=str(tmp_path)))
    assert not any(tmp_path.iterdir())

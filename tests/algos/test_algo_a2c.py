"""rlstruct/algos/a2c.py: the loss against a loop, recurrent state continuity across segments,
runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gymnasium.spaces import Box, Discrete
from support.algo_runs import check_run_dir, evaluated_rows, run_algo
from support.trajectory_builders import collect, gae_by_loops, steps

from rlstruct import DictTensor, Trajectories, replay_agent
from rlstruct import keys as K
from rlstruct.algos import a2c
from rlstruct.blocks.distributions import CategoricalHead
from rlstruct.runs.layout import LayoutConfig


def _recurrent_segments(n_segments: int = 3) -> tuple[a2c.GRUActorCritic, list[Trajectories]]:
    torch.manual_seed(0)
    model = a2c.GRUActorCritic(obs_dim=4, action_space=Discrete(2), hidden=16)
    return model, collect(a2c.A2CAgent, model, n_segments=n_segments, n_timesteps=8)


# ----------------------------------------------------------------------------- loss
@pytest.mark.parametrize("norm", [True, False])
def test_a2c_loss_matches_a_python_loop_and_ignores_padding(norm):
    g = torch.Generator().manual_seed(0)
    lengths = [4, 2]
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    logits = torch.randn(2, 4, 3, generator=g)
    value, next_value, reward = (torch.randn(2, 4, generator=g) for _ in range(3))
    terminated = torch.tensor([[False, True, False, False], [False] * 4])
    truncated = torch.tensor([[False] * 4, [True, False, False, False]])
    action = torch.randint(3, (2, 4), generator=g)
    for x in (logits, value, next_value, reward):
        x[~mask] = 1e6  # padding garbage must never leak into the loss
    traj = Trajectories(DictTensor(), steps(
        lengths, reward=reward, terminated=terminated, truncated=truncated,
        **{"action/sample": action},
    ))
    cfg = a2c.Config(gamma=0.9, gae_lambda=0.8, vf_coef=0.5, ent_coef=0.01,
                     normalize_advantages=norm)
    value.requires_grad_(True)
    loss, stats = a2c.a2c_loss(CategoricalHead(1, 3), logits, value, next_value, traj, cfg)

    adv, ret = gae_by_loops(reward, value.detach(), next_value, terminated, truncated, lengths,
                            0.9, 0.8)
    valid = [(b, t) for b in range(2) for t in range(lengths[b])]
    a = torch.tensor([float(adv[b, t]) for b, t in valid])
    if norm:
        a = (a - a.mean()) / (a.std(correction=0) + 1e-8)
    log_probs = logits.log_softmax(-1)
    n = len(valid)
    policy = -sum(float(log_probs[b, t, action[b, t]]) * a[i] for i, (b, t) in enumerate(valid))
    values = sum(float(value[b, t].detach() - ret[b, t]) ** 2 for b, t in valid)
    entropy = -sum(float((log_probs[b, t].exp() * log_probs[b, t]).sum()) for b, t in valid)
    assert stats["policy_loss"] == pytest.approx(float(policy) / n, rel=1e-5, abs=1e-6)
    assert stats["value_loss"] == pytest.approx(values / n, rel=1e-5)
    assert stats["entropy"] == pytest.approx(entropy / n, rel=1e-5)
    expected = float(policy) / n + 0.5 * values / n - 0.01 * entropy / n
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # Advantages and returns are targets: V gets only the value loss's gradient.
    loss.backward()
    expected_grad = torch.where(mask, 0.5 * 2 * (value.detach() - ret) / n, 0.0)
    torch.testing.assert_close(value.grad, expected_grad)


def test_next_values_of_the_memoryless_critic_are_its_values_of_the_next_frames():
    model = a2c.MLPActorCritic(obs_dim=4, action_space=Discrete(2), hidden=16)
    (traj,) = collect(a2c.A2CAgent, model, n_segments=1)
    out = a2c.replay(a2c.A2CAgent(model), traj)
    next_frame = traj.trajectories["_observation/frame"]
    with torch.no_grad():
        expected = model(next_frame.flatten(0, 1), None)[1].view(next_frame.shape[:2])
    torch.testing.assert_close(a2c.next_values(model, traj, out), expected)


def test_recurrent_next_values_continue_the_episode_memory():
    # Inside an episode, V of the next observation is the value the agent computes at t + 1.
    model, (traj,) = _recurrent_segments(n_segments=1)
    out = a2c.replay(a2c.A2CAgent(model), traj)
    next_value = a2c.next_values(model, traj, out)
    goes_on = ~traj.trajectories["_observation/done"][:, :-1]
    assert goes_on.any()
    torch.testing.assert_close(next_value[:, :-1][goes_on], out["value"][:, 1:][goes_on].detach())


# ----------------------------------------------------------------------------- recurrent agent
def test_agent_resets_its_memory_where_an_episode_starts():
    model = a2c.GRUActorCritic(obs_dim=3, action_space=Discrete(2), hidden=8)
    agent = a2c.A2CAgent(model)
    frame = torch.randn(2, 3)
    start = torch.tensor([True, False])
    state = DictTensor({"h": torch.randn(2, 16)})
    obs = DictTensor({"frame": frame, "initial_state": start})
    out, new_state = agent(state, obs, DictTensor())
    fresh, fresh_state = agent(agent.initial_state(DictTensor(), 2), obs, DictTensor())
    torch.testing.assert_close(out["params"][0], fresh["params"][0])  # row 0 starts afresh
    torch.testing.assert_close(new_state["h"][0], fresh_state["h"][0])
    assert not torch.allclose(out["params"][1], fresh["params"][1])  # row 1 remembers


def test_replay_from_the_stored_agent_state_reproduces_every_segment_exactly():
    model, segments = _recurrent_segments()
    agent = a2c.A2CAgent(model)
    for traj in segments:
        out = replay_agent(agent, traj)
        torch.testing.assert_close(out["params"], traj.trajectories["action/params"],
                                   rtol=0, atol=1e-5)
        torch.testing.assert_close(out["value"], traj.trajectories["action/value"],
                                   rtol=0, atol=1e-5)
        assert out["params"].requires_grad


def test_replay_from_zeros_does_not_reproduce_a_later_segment():
    model, segments = _recurrent_segments()
    agent = a2c.A2CAgent(model)
    for traj in segments[1:]:
        # Some episode runs on across the cut (else the stored state would not matter).
        assert not traj.trajectories["observation/initial_state"][:, 0].all()
        assert traj.info["agent_state/h"].abs().sum() > 0
        from_zeros = Trajectories(traj.info.unset_key(K.AGENT_STATE), traj.trajectories)
        out = replay_agent(agent, from_zeros)
        gap = (out["params"] - traj.trajectories["action/params"]).abs().max()
        assert gap > 1e-4, f"replaying from zeros reproduced the segment (max gap {gap})"


# ----------------------------------------------------------------------------- runs
SMOKE = ["--max-frames", "1500", "--n-envs", "2", "--n-timesteps", "16", "--eval-every", "2",
         "--seed", "0"]


def layout(**kw) -> LayoutConfig:
    return LayoutConfig(**{"learner_device": "cpu", "n_processes": 1, "n_envs": 2, **kw})


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_recurrent_smoke_run_from_another_folder_writes_a_complete_run_dir(tmp_path):
    run_dir, stdout = run_algo("a2c", [*SMOKE, "--recurrent"], cwd=tmp_path)  # 2 workers
    rows = check_run_dir(run_dir)
    assert int(rows[-1]["frames"]) >= 1500 and "a2c: stopped by max_frames" in stdout
    assert evaluated_rows(rows)
    assert {"loss", "policy_loss", "value_loss", "entropy", "lr"} <= set(rows[-1])


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("recurrent", [False, True])
def test_check_devices_smoke_run(tmp_path, recurrent):
    cfg = a2c.Config(layout=layout(check_devices=True), n_timesteps=16, max_frames=300,
                     eval_every=1, recurrent=recurrent, runs_dir=str(tmp_path))
    check_run_dir(Path(a2c.main(cfg)["run_dir"]))


@pytest.mark.slow
def test_learns_the_repeat_env(tmp_path):
    # Reward 1 per step for repeating the observed symbol: random play earns 5 of 10.
    cfg = a2c.Config(
        env_id="rlstruct/Repeat-v0", layout=layout(n_envs=8), n_timesteps=16, eval_every=0,
        target_return=9.5, max_frames=50_000, time_budget=50, runs_dir=str(tmp_path),
    )
    summary = a2c.main(cfg)
    assert summary["train_return_mean20"] >= 8.0, summary


@pytest.mark.gpu
@pytest.mark.parametrize("recurrent", [False, True])
def test_gpu_layout(tmp_path, recurrent):
    cfg = a2c.Config(
        layout=LayoutConfig(learner_device="cuda:0", batcher_device="cuda", eval_device="cpu",
                            n_envs=4, check_devices=True),
        max_frames=2000, eval_every=1, recurrent=recurrent, runs_dir=str(tmp_path),
    )
    check_run_dir(Path(a2c.main(cfg)["run_dir"]))


# ----------------------------------------------------------------------------- Box actions
@pytest.mark.parametrize("recurrent", [False, True])
def test_box_actions_the_loss_takes_the_gaussians_log_prob_of_the_unclipped_sample(recurrent):
    torch.manual_seed(0)
    net = a2c.GRUActorCritic if recurrent else a2c.MLPActorCritic
    model = net(obs_dim=3, action_space=Box(-2.0, 2.0, (1,)), hidden=8)
    (traj,) = collect(a2c.A2CAgent, model, n_segments=1, env="Pendulum-v1", n_timesteps=8)
    stored = traj.trajectories
    assert stored["action/action"].abs().max() <= 2.0
    assert torch.equal(stored["action/action"], (2 * stored["action/sample"]).clamp(-2, 2))
    out = a2c.replay(a2c.A2CAgent(model), traj)
    torch.testing.assert_close(out["params"], stored["action/params"], rtol=0, atol=1e-5)
    cfg = a2c.Config(normalize_advantages=False, ent_coef=0.01)
    loss, stats = a2c.a2c_loss(model.head, out["params"], out["value"],
                               a2c.next_values(model, traj, out), traj, cfg)
    mean, log_std = out["params"][..., :1], out["params"][..., 1:]
    normal = torch.distributions.Normal(mean, log_std.exp())
    entropy = normal.entropy().sum(-1).mean()
    assert stats["entropy"] == pytest.approx(float(entropy.detach()), rel=1e-5)
    loss.backward()
    assert all(p.grad is not None for p in model.head.parameters())

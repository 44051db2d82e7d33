"""rlstruct/algos/a2c.py: the loss against a loop, the zoo's models (recurrent state continuity
across segments), the Atari preset, runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from gymnasium.spaces import Box, Discrete
from support.algo_runs import check_run_dir, evaluated_rows, run_algo
from support.trajectory_builders import collect, gae_by_loops, steps

from rlstruct import DictTensor, Trajectories, replay_agent
from rlstruct import keys as K
from rlstruct.algos import a2c
from rlstruct.blocks.distributions import CategoricalHead, space_spec
from rlstruct.blocks.optim import RMSpropTF
from rlstruct.blocks.recurrent import RecurrentAgent, bootstrap_steps
from rlstruct.blocks.sampling import PolicyAgent
from rlstruct.blocks.zoo import actor_critic
from rlstruct.runs.layout import LayoutConfig


def _model(name: str, obs_dim: int = 4, space=None, hidden: int = 16) -> torch.nn.Module:
    """The zoo's ``--model name`` as a2c.main builds it."""
    return actor_critic(name, (obs_dim,), space_spec(space or Discrete(2)), hidden)


def _recurrent_segments(n_segments: int = 3, name: str = "mlp-gru"
                        ) -> tuple[torch.nn.Module, list[Trajectories]]:
    torch.manual_seed(0)
    model = _model(name)
    return model, collect(RecurrentAgent, model, n_segments=n_segments, n_timesteps=8)


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
    model = _model("mlp")
    (traj,) = collect(PolicyAgent, model, n_segments=1)
    out = a2c.replay(PolicyAgent(model), traj)
    next_frame = traj.trajectories["_observation/frame"]
    with torch.no_grad():
        expected = model(next_frame.flatten(0, 1))[1].view(next_frame.shape[:2])
    mask = traj.trajectories.mask()
    torch.testing.assert_close(a2c.next_values(model, traj, out)[mask], expected[mask])


def test_the_agent_of_each_model():
    assert a2c.agent_class("mlp") is PolicyAgent and a2c.agent_class("cnn") is PolicyAgent
    assert all(a2c.agent_class(m) is RecurrentAgent
               for m in ("mlp-lstm", "mlp-gru", "cnn-lstm", "cnn-gru"))


def test_recurrent_next_values_continue_the_episode_memory():
    # Inside an episode, V of the next observation is the value the agent computes at t + 1.
    model, (traj,) = _recurrent_segments(n_segments=1)
    out = a2c.replay(RecurrentAgent(model), traj)
    next_value = a2c.next_values(model, traj, out)
    goes_on = ~traj.trajectories["_observation/done"][:, :-1]
    assert goes_on.any()
    torch.testing.assert_close(next_value[:, :-1][goes_on], out["value"][:, 1:][goes_on].detach())


# ----------------------------------------------------------------------------- recurrent agent
def test_agent_resets_its_memory_where_an_episode_starts():
    model = _model("mlp-gru", obs_dim=3, hidden=8)
    agent = RecurrentAgent(model)
    frame = torch.randn(2, 3)
    start = torch.tensor([True, False])
    state = DictTensor({"h": torch.randn(2, 16)})
    obs = DictTensor({"frame": frame, "initial_state": start})
    out, new_state = agent(state, obs, DictTensor())
    fresh, fresh_state = agent(agent.initial_state(DictTensor(), 2), obs, DictTensor())
    torch.testing.assert_close(out["value"][0], fresh["value"][0])  # row 0 starts afresh
    torch.testing.assert_close(new_state["h"][0], fresh_state["h"][0])
    assert not torch.allclose(new_state["h"][1], fresh_state["h"][1])  # row 1 remembers
    assert not torch.allclose(out["value"][1], fresh["value"][1])


def _replayed_logp(model: torch.nn.Module, out, traj: Trajectories) -> torch.Tensor:
    return model.head.log_prob(out["params"], traj.trajectories["action/sample"])


@pytest.mark.parametrize("name", ["mlp-gru", "mlp-lstm"])
def test_replay_from_the_stored_agent_state_reproduces_every_segment_exactly(name):
    model, segments = _recurrent_segments(name=name)
    agent = RecurrentAgent(model)
    for traj in segments:
        out = a2c.replay(agent, traj)
        stored, mask = traj.trajectories, traj.trajectories.mask()
        logp = _replayed_logp(model, out, traj)
        torch.testing.assert_close(logp[mask], stored["action/logp"][mask], rtol=0, atol=1e-5)
        torch.testing.assert_close(out["value"][mask], stored["action/value"][mask],
                                   rtol=0, atol=1e-5)
        # the state after the steps the learner reads it at (an LSTM's fused replay computes
        # its cell half there only: rlstruct.blocks.recurrent.replay_rows)
        read = mask & bootstrap_steps(stored)
        torch.testing.assert_close(out["h"][read], stored["action/h"][read], rtol=0, atol=1e-5)
        assert out["params"].requires_grad and out["value"].requires_grad


def test_replay_from_zeros_does_not_reproduce_a_later_segment():
    model, segments = _recurrent_segments()
    agent = RecurrentAgent(model)
    for traj in segments[1:]:
        # Some episode runs on across the cut (else the stored state would not matter).
        assert not traj.trajectories["observation/initial_state"][:, 0].all()
        assert traj.info["agent_state/h"].abs().sum() > 0
        from_zeros = Trajectories(traj.info.unset_key(K.AGENT_STATE), traj.trajectories)
        out = replay_agent(agent, from_zeros)
        gap = (_replayed_logp(model, out, traj) - traj.trajectories["action/logp"]).abs().max()
        assert gap > 1e-5, f"replaying from zeros reproduced the segment (max gap {gap})"


def test_a_recurrent_learn_step_changes_the_cell_and_reports_finite_losses():
    model, (traj,) = _recurrent_segments(n_segments=1, name="mlp-lstm")
    agent, before = RecurrentAgent(model), {k: v.clone() for k, v in model.state_dict().items()}
    cfg = a2c.Config(model="mlp-lstm")
    stats = a2c.learn(agent, a2c.make_optimizer(cfg)(model.parameters(), device="cpu"), traj,
                      cfg)
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert any("core.cell" in k for k in changed), changed


# ----------------------------------------------------------------------------- runs
SMOKE = ["--max-frames", "1500", "--n-envs", "2", "--n-timesteps", "16", "--eval-every", "2",
         "--seed", "0"]


def layout(**kw) -> LayoutConfig:
    return LayoutConfig(**{"learner_device": "cpu", "n_processes": 1, "n_envs": 2, **kw})


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_recurrent_smoke_run_from_another_folder_writes_a_complete_run_dir(tmp_path):
    run_dir, stdout = run_algo("a2c", [*SMOKE, "--model", "mlp-gru"], cwd=tmp_path)  # 2 workers
    rows = check_run_dir(run_dir)
    assert int(rows[-1]["frames"]) >= 1500 and "a2c: stopped by max_frames" in stdout
    assert evaluated_rows(rows)
    assert {"loss", "policy_loss", "value_loss", "entropy", "lr"} <= set(rows[-1])


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("model", ["mlp", "mlp-gru"])
def test_check_devices_smoke_run(tmp_path, model):
    cfg = a2c.Config(layout=layout(check_devices=True), n_timesteps=16, max_frames=300,
                     eval_every=1, model=model, runs_dir=str(tmp_path))
    check_run_dir(Path(a2c.main(cfg)["run_dir"]))


@pytest.mark.timeout(120)
def test_recurrent_smoke_run_on_cartpole_without_velocities(tmp_path):
    cfg = a2c.Config(env_id="rlstruct/CartPoleNoVel-v1", layout=layout(), n_timesteps=8,
                     max_frames=400, eval_every=0, model="mlp-lstm", optimizer="rmsprop",
                     runs_dir=str(tmp_path))
    summary = a2c.main(cfg)
    rows = check_run_dir(Path(summary["run_dir"]))
    assert summary["frames"] >= 400 and int(rows[-1]["episodes"]) > 0
    latest = torch.load(Path(summary["run_dir"]) / "checkpoints" / "latest.pt")
    assert any("core.cell" in k for k in latest["model"]), sorted(latest["model"])


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
@pytest.mark.parametrize("model", ["mlp", "mlp-gru"])
def test_gpu_layout(tmp_path, model):
    cfg = a2c.Config(
        layout=LayoutConfig(learner_device="cuda:0", batcher_device="cuda", eval_device="cpu",
                            n_envs=4, check_devices=True),
        max_frames=2000, eval_every=1, model=model, runs_dir=str(tmp_path),
    )
    check_run_dir(Path(a2c.main(cfg)["run_dir"]))


# ----------------------------------------------------------------------------- Box actions
@pytest.mark.parametrize("name", ["mlp", "mlp-gru"])
def test_box_actions_the_loss_takes_the_gaussians_log_prob_of_the_unclipped_sample(name):
    torch.manual_seed(0)
    model = _model(name, obs_dim=3, space=Box(-2.0, 2.0, (1,)), hidden=8)
    agent = a2c.agent_class(name)
    (traj,) = collect(agent, model, n_segments=1, env="Pendulum-v1", n_timesteps=8)
    stored = traj.trajectories
    assert stored["action/action"].abs().max() <= 2.0
    assert torch.equal(stored["action/action"], (2 * stored["action/sample"]).clamp(-2, 2))
    out = a2c.replay(agent(model), traj)
    torch.testing.assert_close(_replayed_logp(model, out, traj), stored["action/logp"],
                               rtol=0, atol=1e-5)
    cfg = a2c.Config(normalize_advantages=False, ent_coef=0.01)
    loss, stats = a2c.a2c_loss(model.head, out["params"], out["value"],
                               a2c.next_values(model, traj, out), traj, cfg)
    mean, log_std = out["params"][..., :1], out["params"][..., 1:]
    normal = torch.distributions.Normal(mean, log_std.exp())
    entropy = normal.entropy().sum(-1).mean()
    assert stats["entropy"] == pytest.approx(float(entropy.detach()), rel=1e-5)
    loss.backward()
    assert all(p.grad is not None for p in model.head.parameters())


# ----------------------------------------------------------------------------- RMSprop, TF's
def test_rmsprop_tf_takes_the_hand_computed_steps():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = RMSpropTF([w], lr=0.1, alpha=0.9, eps=0.01)
    expected, square_avg = [1.0, -2.0], [1.0, 1.0]  # TF's square average starts at ones
    for grad in ([2.0, 0.5], [-1.0, 3.0]):
        w.grad = torch.tensor(grad)
        opt.step()
        for i, g in enumerate(grad):
            square_avg[i] = 0.9 * square_avg[i] + 0.1 * g * g
            expected[i] -= 0.1 * g / math.sqrt(square_avg[i] + 0.01)  # eps inside the root
        torch.testing.assert_close(w.detach(), torch.tensor(expected))
        torch.testing.assert_close(opt.state[w]["square_avg"], torch.tensor(square_avg))


def test_rmsprop_tf_is_not_torch_s_rmsprop_and_skips_parameters_without_gradients():
    a, b, idle = (torch.nn.Parameter(torch.ones(3)) for _ in range(3))
    tf_like = RMSpropTF([a, idle], lr=1e-2, alpha=0.99, eps=1e-5)
    torch_s = torch.optim.RMSprop([b], lr=1e-2, alpha=0.99, eps=1e-5)
    a.grad, b.grad = torch.full((3,), 0.5), torch.full((3,), 0.5)
    tf_like.step()
    torch_s.step()
    # torch's first step is lr g / (|g| sqrt(1 - alpha)): 10 lr; TF's about lr g.
    assert float(1 - b.detach()[0]) == pytest.approx(0.1, rel=1e-3)
    square_avg = 0.99 * 1.0 + 0.01 * 0.5**2
    assert float(1 - a.detach()[0]) == pytest.approx(1e-2 * 0.5 / math.sqrt(square_avg + 1e-5))
    assert torch.equal(idle.detach(), torch.ones(3)) and idle not in tf_like.state
    with pytest.raises(ValueError, match="alpha"):
        RMSpropTF([a], lr=1e-3, alpha=1.0)


def test_the_optimizer_flag_picks_the_optimizer():
    params = [torch.nn.Parameter(torch.ones(2))]
    rms = a2c.make_optimizer(a2c.Config(optimizer="rmsprop", lr=7e-4))(params, device="cpu")
    assert isinstance(rms, RMSpropTF)
    assert rms.defaults == {"lr": 7e-4, "alpha": 0.99, "eps": 1e-5}
    adam = a2c.make_optimizer(a2c.Config())(params, device="cpu")
    assert isinstance(adam, torch.optim.Adam) and adam.defaults["lr"] == a2c.Config().lr


# ----------------------------------------------------------------------------- Atari preset
def test_the_atari_preset_is_rl_zoo_s_a2c_on_two_workers():
    pytest.importorskip("ale_py", reason="resolving an Atari env needs the atari extra: "
                        "pip install -e '.[atari]'")
    pytest.importorskip("cv2", reason="needs the atari extra: pip install -e '.[atari]'")
    from rlstruct.runs.resolve import parse

    cfg = parse(a2c.Config, ["--preset", "atari", "--seed", "3"]).cfg
    assert (cfg.preset, cfg.seed, cfg.env_id, cfg.env_backend, cfg.model, cfg.optimizer) == (
        "atari", 3, "PongNoFrameskip-v4", "atari", "cnn", "rmsprop")
    assert (cfg.layout.n_processes, cfg.layout.n_envs, cfg.n_timesteps, cfg.frame_stack) == (
        2, 8, 5, 4)
    assert (cfg.lr, cfg.gamma, cfg.gae_lambda, cfg.ent_coef, cfg.vf_coef, cfg.max_grad_norm) == (
        7e-4, 0.99, 1.0, 0.01, 0.25, 0.5)
    assert not cfg.normalize_advantages and cfg.max_frames == 10_000_000
    assert cfg.target_return is None and cfg.problems() == []


def test_the_cnn_is_refused_for_flat_observations_before_a_run_folder_exists(tmp_path):
    from rlstruct.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--model cnn takes image frames .* \(4,\)"):
        a2c.main(a2c.Config(model="cnn", runs_dir=str(tmp_path)))
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_atari_preset_runs_iterations_on_pong(tmp_path):
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install -e '.[atari]'")
    pytest.importorskip("cv2", reason="needs the atari extra: pip install -e '.[atari]'")
    from rlstruct.runs.presets import build_preset  # the preset as --preset atari applies it

    cfg = build_preset(a2c.Config, "atari", dict(n_processes=1, n_envs=2, max_frames=20,
                                                 runs_dir=str(tmp_path)))
    summary = a2c.main(cfg)
    rows = check_run_dir(Path(summary["run_dir"]))
    assert summary["frames"] >= 20 and math.isfinite(float(rows[0]["loss"]))
    assert float(rows[0]["entropy"]) == pytest.approx(math.log(6), rel=1e-2)  # Pong's 6 actions
    latest = torch.load(Path(summary["run_dir"]) / "checkpoints" / "latest.pt")
    assert latest["config"]["optimizer"] == "rmsprop" and latest["config"]["model"] == "cnn"
    assert all(set(s) == {"square_avg"} for s in latest["optimizer"]["state"].values())

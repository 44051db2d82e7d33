"""rlstruct/algos/ppo.py: known-answer tests of the loss pieces, replay, smoke runs, a learning
test."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import tyro
from gymnasium import spaces
from support.algo_runs import check_run_dir, evaluated_rows, run_algo
from support.trajectory_builders import collect, gae_by_loops, steps

from rlstruct import DictTensor, Trajectories, replay_agent_stateless
from rlstruct import keys as K
from rlstruct.algos import ppo
from rlstruct.blocks import segment_minibatches as seg
from rlstruct.blocks.distributions import make_head, space_spec
from rlstruct.blocks.nets import HeadActorCritic
from rlstruct.blocks.recurrent import RecurrentAgent
from rlstruct.errors import ConfigError, DeviceContractError
from rlstruct.runs.layout import LayoutConfig


def actor_critic(obs_dim: int, n_actions: int, hidden: int) -> HeadActorCritic:
    """PPO's model for ``Discrete(n_actions)``: its params are the logits."""
    return HeadActorCritic(obs_dim, make_head(spaces.Discrete(n_actions), hidden), hidden)


# ----------------------------------------------------------------------------- loss pieces
def test_clipped_policy_loss_takes_the_pessimistic_side_of_the_clip():
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1, 1.0])
    advantage = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0, -3.0])
    loss = ppo.clipped_policy_loss(ratio.log(), torch.zeros(6), advantage, clip=0.2)
    # A > 0: the gain stops at 1 + eps; A < 0: the loss is never clipped away when r grows;
    # r < 1 - eps with A > 0 is not clipped (min keeps r A); inside the clip range: -r A.
    torch.testing.assert_close(loss, torch.tensor([-1.2, 1.5, -0.5, 0.8, -2.2, 3.0]))


def test_clipped_policy_loss_passes_no_gradient_once_clipped():
    logp = torch.tensor([math.log(1.5), math.log(1.1)], requires_grad=True)
    ppo.clipped_policy_loss(logp, torch.zeros(2), torch.ones(2), clip=0.2).sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, -1.1]))  # d(-r)/dlogp = -r


def test_value_loss_unclipped_and_clipped():
    value, old = torch.tensor([3.0, 1.2, 0.0, 4.0]), torch.tensor([1.0, 1.0, 1.0, 1.0])
    returns = torch.tensor([2.0, 3.0, 3.0, 3.0])
    plain = ppo.value_loss(value, old, returns, clip=None)
    torch.testing.assert_close(plain, torch.tensor([0.5, 1.62, 4.5, 0.5]))
    # Clipped: V_old + clamp(V - V_old, -0.5, 0.5) = [1.5, 1.2, 0.5, 1.5]; the max of both.
    clipped = ppo.value_loss(value, old, returns, clip=0.5)
    torch.testing.assert_close(clipped, torch.tensor([0.5, 1.62, 4.5, 1.125]))


def test_gae_advantages_bootstrap_from_the_critic_on_the_true_next_observation():
    model = actor_critic(obs_dim=2, n_actions=2, hidden=8)
    # Row 0 terminates at t=1; row 1 is truncated at t=0, then padding; row 2 is cut at t=2.
    reward = torch.tensor([[1.0, 2.0, 3.0], [1.0, 7.0, 7.0], [0.5, 0.5, 0.5]])
    terminated = torch.tensor([[False, True, False], [False] * 3, [False] * 3])
    truncated = torch.tensor([[False] * 3, [True, False, False], [False] * 3])
    next_frame = torch.randn(3, 3, 2)
    traj = Trajectories(DictTensor(), steps(
        [3, 1, 3], reward=reward, terminated=terminated, truncated=truncated,
        next_frame=next_frame, **{"action/value": torch.randn(3, 3)},
    ))
    adv, ret = ppo.gae_advantages(model, traj, gamma=0.9, lam=0.8)
    with torch.no_grad():
        next_value = model.value(next_frame.flatten(0, 1)).view(3, 3)
    exp_adv, exp_ret = gae_by_loops(
        reward, traj.trajectories["action/value"], next_value, terminated, truncated,
        [3, 1, 3], 0.9, 0.8,
    )
    torch.testing.assert_close(adv, exp_adv)
    torch.testing.assert_close(ret, exp_ret)


@pytest.mark.parametrize("adv_norm", ["minibatch", "off"])
def test_ppo_loss_matches_the_formula_written_out(adv_norm):
    torch.manual_seed(0)
    model = actor_critic(obs_dim=3, n_actions=2, hidden=8)
    n = 5
    frame, action = torch.randn(n, 3), torch.randint(2, (n,))
    logp_old, value_old = -torch.rand(n), torch.randn(n)
    adv, ret = torch.randn(n), torch.randn(n)
    minibatch = DictTensor({  # transitions, as learn() takes them from to_transitions()
        "observation/frame": frame, "action/sample": action, "action/logp": logp_old,
        "action/value": value_old, "advantage": adv, "return": ret,
    })
    cfg = ppo.Config(clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, adv_norm=adv_norm)
    loss, stats = ppo.ppo_loss(ppo.PPOAgent(model), minibatch, cfg)

    with torch.no_grad():
        logits, value = model(frame)
    expected_policy = expected_value = expected_entropy = 0.0
    a = adv
    if adv_norm == "minibatch":
        a = (a - a.mean()) / (a.std(correction=0) + 1e-8)
    for i in range(n):
        p = torch.softmax(logits[i], -1)
        r = math.exp(float(p[action[i]].log() - logp_old[i]))
        expected_policy -= min(r * a[i], min(max(r, 0.8), 1.2) * a[i]) / n
        expected_value += 0.5 * float(value[i] - ret[i]) ** 2 / n
        expected_entropy -= float((p * p.log()).sum()) / n
    assert stats["policy_loss"].item() == pytest.approx(float(expected_policy), rel=1e-5, abs=1e-6)
    assert stats["value_loss"].item() == pytest.approx(expected_value, rel=1e-5)
    assert stats["entropy"].item() == pytest.approx(expected_entropy, rel=1e-5)
    expected = expected_policy + 0.5 * expected_value - 0.01 * expected_entropy
    assert loss.item() == pytest.approx(float(expected), rel=1e-5, abs=1e-6)


def test_replay_reproduces_the_logp_and_value_the_workers_stored():
    model = actor_critic(obs_dim=4, n_actions=2, hidden=16)
    (traj,) = collect(ppo.PPOAgent, model, n_segments=1)
    out = replay_agent_stateless(ppo.PPOAgent(model), traj)
    stored = traj.trajectories
    logp = out["params"].log_softmax(-1).gather(-1, stored["action/action"].unsqueeze(-1))
    torch.testing.assert_close(logp.squeeze(-1), stored["action/logp"])
    torch.testing.assert_close(out["value"], stored["action/value"])
    assert out["params"].requires_grad
    assert stored["action/sample"].equal(stored["action/action"])  # Discrete: one and the same


def test_agent_samples_reproducibly_and_acts_greedily_on_request():
    model = actor_critic(obs_dim=3, n_actions=4, hidden=8)
    obs, state = DictTensor({"frame": torch.randn(64, 3)}), DictTensor(batch_size=64)
    a, b = ppo.PPOAgent(model), ppo.PPOAgent(model)
    a.seed(7)
    b.seed(7)
    first = a(state, obs, DictTensor())[0]
    assert first["action"].equal(b(state, obs, DictTensor())[0]["action"])
    greedy = DictTensor({"greedy": torch.ones(64, dtype=torch.bool)})
    assert a(state, obs, greedy)[0]["action"].equal(model(obs["frame"])[0].argmax(-1))


@pytest.mark.parametrize("adv_norm,value_clip", [("batch", 0.2), ("off", None)])
def test_learn_runs_every_option_and_changes_the_model(adv_norm, value_clip):
    model = actor_critic(obs_dim=4, n_actions=2, hidden=16)
    (traj,) = collect(ppo.PPOAgent, model, n_segments=1)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = ppo.Config(n_epochs=2, minibatch_size=12, adv_norm=adv_norm, value_clip=value_clip)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    stats = ppo.learn(ppo.PPOAgent(model), optimizer, traj, cfg)
    assert set(stats) == {"policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"}
    assert all(math.isfinite(v) for v in stats.values())
    assert any(not p.equal(q) for p, q in zip(model.parameters(), before))


# ----------------------------------------------------------------------------- runs
SMOKE = ["--max-frames", "1500", "--n-envs", "2", "--n-timesteps", "16", "--eval-every", "2",
         "--n-epochs", "2", "--seed", "0"]


def layout(**kw) -> LayoutConfig:
    return LayoutConfig(**{"learner_device": "cpu", "n_processes": 1, "n_envs": 2, **kw})


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_smoke_run_from_another_folder_writes_a_complete_run_dir(tmp_path):
    run_dir, stdout = run_algo("ppo", SMOKE, cwd=tmp_path)  # worker processes (2 by default)
    assert run_dir.parent == tmp_path / "runs"
    rows = check_run_dir(run_dir)
    assert int(rows[-1]["frames"]) >= 1500 and "ppo: stopped by max_frames" in stdout
    assert evaluated_rows(rows)  # and only there: check_run_dir compares with episodes.csv
    assert {"policy_loss", "value_loss", "entropy", "approx_kl", "lr"} <= set(rows[-1])
    for row in rows[:-1]:  # the logged lr is the annealed lr the step used
        assert float(row["lr"]) == pytest.approx(1e-3 * (1 - int(row["frames"]) / 1500))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_check_devices_smoke_run(tmp_path):
    cfg = ppo.Config(layout=layout(check_devices=True), n_timesteps=16, max_frames=300,
                     eval_every=1, n_epochs=1, runs_dir=str(tmp_path))
    check_run_dir(Path(ppo.main(cfg)["run_dir"]))


class _MetaAgent(ppo.PPOAgent):
    """Returns its outputs on the meta device: a planted device-contract breach."""

    def __call__(self, state, observation, agent_info):
        action, state = super().__call__(state, observation, agent_info)
        return action.to("meta"), state


def test_check_devices_catches_a_planted_wrong_device(tmp_path, monkeypatch):
    monkeypatch.setattr(ppo, "PPOAgent", _MetaAgent)
    cfg = ppo.Config(layout=layout(check_devices=True), max_frames=300, runs_dir=str(tmp_path))
    with pytest.raises(DeviceContractError, match=r"action\['action'\] is on meta, expected cpu"):
        ppo.main(cfg)


@pytest.mark.slow
def test_learns_the_repeat_env(tmp_path):
    # Reward 1 per step for repeating the observed symbol: random play earns 5 of 10.
    cfg = ppo.Config(
        env_id="rlstruct/Repeat-v0", layout=layout(n_envs=8), n_timesteps=16, eval_every=0,
        target_return=9.5, max_frames=50_000, time_budget=50, runs_dir=str(tmp_path),
    )
    summary = ppo.main(cfg)
    assert summary["train_return_mean20"] >= 8.0, summary


@pytest.mark.gpu
def test_gpu_layout(tmp_path):
    cfg = ppo.Config(
        layout=LayoutConfig(learner_device="cuda:0", batcher_device="cuda", eval_device="cpu",
                            n_envs=4, check_devices=True),
        max_frames=2000, eval_every=1, n_epochs=2, runs_dir=str(tmp_path),
    )
    check_run_dir(Path(ppo.main(cfg)["run_dir"]))


def test_torch_env_backend_trains_in_the_learners_process(tmp_path):
    cfg = ppo.Config(layout=layout(n_envs=16), env_backend="torch", n_timesteps=16,
                     max_frames=2000, eval_every=0, n_epochs=1, runs_dir=str(tmp_path))
    run_dir = Path(ppo.main(cfg)["run_dir"])
    rows = check_run_dir(run_dir)
    assert int(rows[-1]["frames"]) >= 2000 and float(rows[-1]["episodes"]) > 16
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert config["env_backend"] == "torch"


def test_torch_env_backend_is_refused_for_episodic_collection(tmp_path):
    from rlstruct.algos import reinforce

    cfg = reinforce.Config(layout=layout(), env_backend="torch", runs_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="GymEnvInf"):
        reinforce.main(cfg)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_atari_pong_with_the_nature_cnn_runs_a_few_iterations(tmp_path):
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install -e '.[atari]'")
    pytest.importorskip("cv2", reason="needs the atari extra: pip install -e '.[atari]'")
    cfg = ppo.Config(env_id="ALE/Pong-v5", env_backend="atari", model="cnn",
                     layout=LayoutConfig(learner_device="cpu", n_processes=2, n_envs=1),
                     n_timesteps=32, max_frames=256, n_epochs=1, minibatch_size=32,
                     target_return=None, runs_dir=str(tmp_path))
    summary = ppo.main(cfg)
    assert summary["frames"] >= 256 and summary["stopped_by"] == "max_frames"
    checkpoint = torch.load(Path(summary["run_dir"]) / "checkpoints" / "latest.pt")
    assert "trunk.0.weight" in checkpoint["model"]  # the CNN was trained


def test_pipelined_batches_are_relabelled_by_the_current_policy():
    torch.manual_seed(0)
    model = actor_critic(obs_dim=4, n_actions=2, hidden=8)
    (traj,) = collect(ppo.PPOAgent, model, n_segments=1, n_timesteps=4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)  # the learner moved on since the batch was collected
    stored = traj.trajectories[K.STORED_LOGP].clone()
    relabelled = ppo.relabel(ppo.PPOAgent(model), traj).trajectories
    with torch.no_grad():
        logits, value = model(relabelled[K.OBS_FRAME].flatten(0, 1))
    logp = logits.log_softmax(-1).gather(1, relabelled[K.STORED_SAMPLE].view(-1, 1))
    logp = logp.view(stored.shape)
    torch.testing.assert_close(relabelled[K.STORED_LOGP], logp)
    torch.testing.assert_close(relabelled[K.STORED_VALUE], value.view(stored.shape))
    assert not torch.allclose(stored, logp)


# ----------------------------------------------------------------------------- Box actions
PENDULUM = ["--env-id", "Pendulum-v1", "--gamma", "0.9", "--gae-lambda", "0.95", "--n-epochs",
            "10", "--lr", "1e-3", "--normalize-obs"]


def test_ppo_loss_on_a_gaussian_head_is_torch_distributions_formula():
    torch.manual_seed(0)
    space = spaces.Box(-2.0, 2.0, (2,))
    model = HeadActorCritic(3, make_head(space, 8, log_std_init=-0.5), 8)
    n = 6
    frame, sample = torch.randn(n, 3), 2 * torch.randn(n, 2)  # samples beyond the Box too
    logp_old, adv = -torch.rand(n), torch.randn(n)
    minibatch = DictTensor({
        "observation/frame": frame, "action/sample": sample, "action/logp": logp_old,
        "action/value": torch.zeros(n), "advantage": adv, "return": torch.zeros(n),
    })
    cfg = ppo.Config(adv_norm="off", ent_coef=0.01)
    loss, stats = ppo.ppo_loss(ppo.PPOAgent(model), minibatch, cfg)
    with torch.no_grad():
        params, _ = model(frame)
    normal = torch.distributions.Normal(params[:, :2], params[:, 2:].exp())
    ratio = (normal.log_prob(sample).sum(-1) - logp_old).exp()
    policy = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
    assert stats["policy_loss"].item() == pytest.approx(policy.item(), rel=1e-5, abs=1e-6)
    entropy = normal.entropy().sum(-1).mean()
    assert stats["entropy"].item() == pytest.approx(entropy.item())
    expected = policy + 0.5 * stats["value_loss"] - 0.01 * entropy
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)


def test_learn_on_box_actions_updates_the_policy_and_the_observation_statistics():
    torch.manual_seed(0)
    model = HeadActorCritic(3, make_head(spaces.Box(-2.0, 2.0, (1,)), 16), 16,
                            normalize_obs=True)
    (traj,) = collect(ppo.PPOAgent, model, n_segments=1, env="Pendulum-v1", n_timesteps=16)
    stored = traj.trajectories
    assert stored["action/action"].abs().max() <= 2.0 and stored["action/sample"].shape[-1] == 1
    before = model.head.log_std.detach().clone()
    stats = ppo.learn(ppo.PPOAgent(model), torch.optim.Adam(model.parameters(), 1e-2), traj,
                      ppo.Config(n_epochs=2, minibatch_size=16))
    assert math.isfinite(stats["approx_kl"]) and not model.head.log_std.equal(before)
    assert int(model.obs_norm.count) == 4 * 16  # taken in after the epochs
    torch.testing.assert_close(model.obs_norm.mean.float(),
                               stored["observation/frame"].flatten(0, 1).mean(0))


def test_discrete_only_models_refuse_box_actions_with_a_config_error(tmp_path):
    cfg = ppo.Config(env_id="Pendulum-v1", model="cnn", layout=layout(), runs_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="ppo needs Discrete actions; Pendulum-v1 has Box"):
        ppo.main(cfg)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_learns_pendulum(tmp_path):
    # A random policy scores about -1200 to -1500 per episode; -400 is a clear swing-up.
    cfg = tyro.cli(ppo.Config, args=[*PENDULUM, "--env-backend", "torch", "--n-processes", "1",
                                     "--n-envs", "16", "--n-timesteps", "128"])
    cfg = dataclasses.replace(cfg, target_return=-400.0, max_frames=150_000, time_budget=150,
                              eval_every=0, runs_dir=str(tmp_path))
    summary = ppo.main(cfg)
    assert summary["solved"], summary


def test_mountain_car_continuous_runs_through_the_gaussian_head(tmp_path):
    cfg = ppo.Config(env_id="MountainCarContinuous-v0", layout=layout(n_envs=4), n_timesteps=32,
                     max_frames=256, n_epochs=1, eval_every=0, target_return=None,
                     normalize_obs=True, runs_dir=str(tmp_path))
    summary = ppo.main(cfg)
    assert summary["frames"] >= 256 and summary["stopped_by"] == "max_frames"
    checkpoint = torch.load(Path(summary["run_dir"]) / "checkpoints" / "latest.pt")
    assert "actor.4.log_std" in checkpoint["model"] and "obs_norm.mean" in checkpoint["model"]


def test_next_values_from_the_batch_equal_the_critic_on_every_next_observation():
    """gae_advantages(current=True) takes step t+1's stored value as step t's next value and runs
    the critic only at episode ends and row ends: the same advantages as the critic run on every
    true next observation, when the stored values are the model's own (as the workers store)."""
    torch.manual_seed(0)
    model = actor_critic(obs_dim=4, n_actions=2, hidden=16)
    segments = collect(ppo.PPOAgent, model, n_segments=3, n_timesteps=40, n_envs=3)
    ends = 0
    for traj in segments:
        steps_ = traj.trajectories
        ends += int((steps_["_observation/terminated"] | steps_["_observation/truncated"]).sum())
        full = ppo.gae_advantages(model, traj, gamma=0.99, lam=0.95)
        calls: list[int] = []
        hook = model.critic.register_forward_hook(
            lambda m, i, o, calls=calls: calls.append(i[0].shape[0]))
        fast = ppo.gae_advantages(model, traj, gamma=0.99, lam=0.95, current=True)
        hook.remove()
        torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-5)
        assert calls and calls[0] < 40 * 3  # the critic ran on fewer than every step
    assert ends > 0  # episode ends were inside the batches (CartPole under a random policy)


# ----------------------------------------------------------------------------- recurrent models
NOVEL = "rlstruct/CartPoleNoVel-v1"


def recurrent_batches(model_name: str = "mlp-lstm", n_segments: int = 2, n_envs: int = 4):
    """A zoo recurrent model and consecutive CartPoleNoVel segments its agent collected (the
    second starts from a stored, nonzero state)."""
    import rlstruct.envs  # noqa: F401 (registers rlstruct/CartPoleNoVel-v1)
    from rlstruct.blocks.zoo import actor_critic as zoo_model

    torch.manual_seed(0)
    model = zoo_model(model_name, (2,), space_spec(spaces.Discrete(2)), 16)
    segments = collect(RecurrentAgent, model, n_segments=n_segments, n_timesteps=12,
                       env=NOVEL, n_envs=n_envs)
    return model, segments


def test_recurrent_minibatches_are_whole_rows_with_their_start_state():
    _, (_, traj) = recurrent_batches()
    assert traj.info["agent_state/h"].abs().sum() > 0  # the second segment's memory
    parts = seg.row_minibatches(traj, 2)
    assert [p.n_elems() for p in parts] == [2, 2]
    frames = traj.trajectories[K.OBS_FRAME]
    seen = []
    for part in parts:
        for b in range(part.n_elems()):  # each row is one whole row of the batch, state included
            (row,) = [i for i in range(4) if part.trajectories[K.OBS_FRAME][b].equal(frames[i])]
            assert part.info["agent_state/h"][b].equal(traj.info["agent_state/h"][row])
            assert int(part.trajectories.lengths[b]) == int(traj.trajectories.lengths[row])
            seen.append(row)
    assert sorted(seen) == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match=r"n_minibatches \(3\) must divide the batch's 4 "):
        seg.row_minibatches(traj, 3)


def test_row_split_counts_minibatches_of_whole_rows():
    assert seg.row_split(8, 128, 256, None) == (4, None)  # CleanRL's Atari LSTM: 2 rows each
    assert seg.row_split(8, 32, 256, None) == (1, None)  # rl-zoo's CartPoleNoVel: one of 256
    assert seg.row_split(4, 4, 256, None) == (1, None)  # at least one
    n, problem = seg.row_split(6, 128, 256, 4)
    assert n == 4 and "n_minibatches 4 must divide the batch's 6 env rows" in problem


@pytest.mark.parametrize("model_name", ["mlp-lstm", "mlp-gru"])
def test_recurrent_replay_at_the_first_epoch_reproduces_the_stored_logp(model_name):
    model, (_, traj) = recurrent_batches(model_name)
    agent = RecurrentAgent(model)
    for part in seg.row_minibatches(traj, 2):
        new, stored = seg.replay_valid_steps(agent, part)
        logp = model.head.log_prob(new["params"], stored[K.STORED_SAMPLE])
        torch.testing.assert_close(logp, stored[K.STORED_LOGP])  # ratio 1
        torch.testing.assert_close(new["value"], stored[K.STORED_VALUE])
        assert new["params"].requires_grad
    cfg = ppo.Config(model=model_name, n_minibatches=2)
    steps_ = traj.trajectories.clone()
    steps_.set("advantage", torch.randn(steps_[K.STORED_VALUE].shape))
    steps_.set("return", torch.randn(steps_[K.STORED_VALUE].shape))
    _, stats = ppo.ppo_loss(agent, Trajectories(traj.info, steps_), cfg)
    assert abs(float(stats["approx_kl"])) < 1e-6 and float(stats["clip_fraction"]) == 0.0


def test_recurrent_advantages_bootstrap_under_the_stored_state():
    model, (traj,) = recurrent_batches(n_segments=1)
    adv, ret = seg.recurrent_gae(model, traj, gamma=0.9, lam=0.8)
    stored = traj.trajectories
    with torch.no_grad():  # every next value recomputed under the stored state after the step
        next_value = model.value(stored[K.NEXT_FRAME].flatten(0, 1),
                                 stored["action/h"].flatten(0, 1)).view(adv.shape)
    inside = ~(stored[K.NEXT_TERMINATED] | stored[K.NEXT_TRUNCATED])
    inside[:, -1] = False
    torch.testing.assert_close(next_value[:, :-1][inside[:, :-1]],
                               stored[K.STORED_VALUE][:, 1:][inside[:, :-1]])
    exp_adv, exp_ret = gae_by_loops(
        stored[K.NEXT_REWARD], stored[K.STORED_VALUE], next_value, stored[K.NEXT_TERMINATED],
        stored[K.NEXT_TRUNCATED], stored.lengths.tolist(), 0.9, 0.8)
    torch.testing.assert_close(adv, exp_adv)
    torch.testing.assert_close(ret, exp_ret)


@pytest.mark.parametrize("pipeline", [1, 2])
def test_recurrent_learn_changes_the_model_and_relabels_a_stale_batch(pipeline):
    model, (_, traj) = recurrent_batches()
    stored = traj.trajectories[K.STORED_LOGP].clone()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # the learner moved on since the collection
    before = [p.detach().clone() for p in model.parameters()]
    cfg = ppo.Config(model="mlp-lstm", n_epochs=2, n_minibatches=2, value_clip=0.2,
                     adv_norm="batch", layout=layout(pipeline=pipeline))
    stats = ppo.learn(RecurrentAgent(model), torch.optim.Adam(model.parameters(), 1e-3), traj,
                      cfg)
    assert all(math.isfinite(v) for v in stats.values())
    assert any(not p.equal(q) for p, q in zip(model.parameters(), before))
    relabelled = not torch.allclose(traj.trajectories[K.STORED_LOGP], stored)
    assert relabelled == (pipeline == 2)  # the batch's logp are the learner's own before it learns


@pytest.mark.parametrize(("kw", "match"), [
    (dict(model="cnn-gru", normalize_obs=True), "--normalize-obs True apply to --model mlp only"),
    (dict(model="mlp-lstm", activation="relu"), "--activation relu apply to --model mlp only"),
    (dict(model="mlp-gru", n_minibatches=3), "n_minibatches 3 must divide the batch's 2 env rows"),
    (dict(model="mlp-lstm", layout=layout(n_learners=2)), "recurrent PPO learns in one process"),
    (dict(model="cnn-lstm"), r"--model cnn-lstm takes image frames \(C, H, W\).*\(4,\)"),
])
def test_options_that_do_not_apply_are_refused_before_a_run_folder_exists(tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match):
        ppo.main(ppo.Config(runs_dir=str(tmp_path), **{"layout": layout(), **kw}))
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(180)
def test_recurrent_smoke_run_on_cartpole_without_velocities(tmp_path):
    cfg = ppo.Config(env_id=NOVEL, model="mlp-gru", layout=layout(n_envs=4), n_timesteps=16,
                     max_frames=384, n_epochs=2, n_minibatches=2, eval_every=0,
                     normalize_obs=True, normalize_reward=True, runs_dir=str(tmp_path))
    summary = ppo.main(cfg)
    assert summary["frames"] >= 384 and summary["stopped_by"] == "max_frames"
    rows = check_run_dir(Path(summary["run_dir"]))
    assert math.isfinite(float(rows[0]["approx_kl"]))  # (evaluations run asynchronously)
    checkpoint = torch.load(Path(summary["run_dir"]) / "checkpoints" / "latest.pt")
    assert "towers.0.core.cell.weight_hh" in checkpoint["model"]  # the GRU was trained
    # rl-zoo's VecNormalize: the statistics took in whole batches (4 x 16 steps), rewards too
    seen = checkpoint["model"]["obs_norm.count"].item()
    assert 64 <= seen <= summary["frames"] and seen % 64 == 0
    assert checkpoint["model"]["reward_norm.count"].item() > 0


def test_the_atari_lstm_preset_is_cleanrl_s_on_one_frame():
    cfg = ppo.Config.from_preset("atari-lstm")
    assert (cfg.env_id, cfg.model, cfg.frame_stack, cfg.hidden) == (
        "PongNoFrameskip-v4", "cnn-lstm", 1, 128)
    rows = cfg.layout.n_processes * cfg.layout.n_envs
    assert (rows, cfg.n_timesteps, cfg.n_minibatches, cfg.n_epochs) == (8, 128, 4, 4)
    assert (cfg.clip_coef, cfg.value_clip, cfg.ent_coef, cfg.lr) == (0.1, 0.1, 0.01, 2.5e-4)
    assert cfg.problems() == []


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_atari_lstm_preset_runs_two_iterations_on_pong(tmp_path):
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install -e '.[atari]'")
    pytest.importorskip("cv2", reason="needs the atari extra: pip install -e '.[atari]'")
    from rlstruct.runs.presets import build_preset  # the preset as --preset atari-lstm applies it

    cfg = build_preset(ppo.Config, "atari-lstm", dict(
        n_envs=2, n_timesteps=16, max_frames=128, n_epochs=1, runs_dir=str(tmp_path)))
    summary = ppo.main(cfg)
    assert summary["frames"] >= 128 and summary["iterations"] >= 1, summary  # learned on one
    checkpoint = torch.load(Path(summary["run_dir"]) / "checkpoints" / "latest.pt")
    assert checkpoint["model"]["towers.0.encoder.0.weight"].shape[1] == 1  # one frame in
    assert "towers.0.core.cell.weight_hh" in checkpoint["model"]

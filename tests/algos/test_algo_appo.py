"""rlstruct/algos/appo.py: the V-trace batch and the clipped loss written out, the learner's
epochs and publications, a smoke run and a learning test on a frame budget; the zoo's
recurrent models on minibatches of whole rows; the Atari preset."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import torch
from gymnasium import spaces
from support.algo_runs import check_run_dir, evaluated_rows, run_algo
from support.trajectory_builders import collect

from rlstruct import Trajectories
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.algos import appo
from rlstruct.blocks import vtrace_replay as vr
from rlstruct.blocks import zoo
from rlstruct.blocks.distributions import space_spec
from rlstruct.errors import ConfigError
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import resolve


def segments(n: int = 2) -> tuple[torch.nn.Module, list]:
    torch.manual_seed(0)
    model = zoo.actor_critic("mlp", (4,), space_spec(spaces.Discrete(2)), 16)
    return model, collect(appo.BehaviourAgent, model, n_segments=n, n_timesteps=8)


def written_out(model: torch.nn.Module, traj, cfg: appo.Config, logp_mu: torch.Tensor):
    """pi_old's logp, targets and advantages of the valid steps, from the model and F.vtrace."""
    steps = traj.trajectories
    b, t = steps.lengths.shape[0], steps.n_timesteps()
    with torch.no_grad():
        logits, value = model(steps[K.OBS_FRAME].flatten(0, 1))
        _, next_value = model(steps[K.NEXT_FRAME].flatten(0, 1))
    logp = logits.view(b, t, -1).log_softmax(-1).gather(
        2, steps[K.STORED_ACTION].unsqueeze(2)).squeeze(2)
    targets, adv = F.vtrace(
        steps[K.NEXT_REWARD], value.view(b, t), next_value.view(b, t),
        steps["_observation/terminated"], steps["_observation/truncated"], steps.lengths,
        logp - logp_mu, cfg.gamma, cfg.rho_bar, cfg.c_bar,
    )
    mask = steps.mask()
    return logp[mask], targets[mask], adv[mask]


def test_the_batch_holds_vtrace_targets_and_advantages_of_the_valid_steps():
    model, (traj, _) = segments()
    cfg = appo.Config()
    batch, rho = appo.vtrace_batch(appo.BehaviourAgent(model), traj, cfg)
    logp, targets, adv = written_out(model, traj, cfg, traj.trajectories[K.STORED_LOGP])
    assert batch.n_elems() == int(traj.lengths.sum()) == rho.numel()
    torch.testing.assert_close(batch[K.STORED_LOGP], logp)  # mu, which is pi_old here
    torch.testing.assert_close(batch["target"], targets)
    torch.testing.assert_close(batch["advantage"], adv)
    torch.testing.assert_close(rho, torch.ones_like(rho))  # collected by this very model


def test_a_stale_behaviour_policy_enters_through_the_importance_weights():
    model, (traj, _) = segments()
    mu = traj.trajectories[K.STORED_LOGP] + 0.5  # mu gave the actions more probability
    traj.trajectories[K.STORED_LOGP] = mu
    cfg = appo.Config(c_bar=0.9)
    batch, rho = appo.vtrace_batch(appo.BehaviourAgent(model), traj, cfg)
    _, targets, adv = written_out(model, traj, cfg, mu)
    torch.testing.assert_close(batch[K.STORED_LOGP], mu[traj.trajectories.mask()])  # clip: mu
    torch.testing.assert_close(rho, torch.full_like(rho, float(torch.tensor(-0.5).exp())))
    torch.testing.assert_close(batch["target"], targets)
    torch.testing.assert_close(batch["advantage"], adv)
    on_policy, _ = appo.vtrace_batch(appo.BehaviourAgent(model), segments()[1][0], cfg)
    assert not torch.allclose(on_policy["advantage"], batch["advantage"])


def test_loss_is_the_clipped_objective_plus_value_and_entropy_terms():
    model, (traj, _) = segments()
    cfg = appo.Config(ent_coef=0.1, vf_coef=0.7, clip_coef=0.1)
    batch, _ = appo.vtrace_batch(appo.BehaviourAgent(model), traj, cfg)
    rows = torch.arange(0, batch.n_elems(), 2)
    mb = batch.index(rows)
    with torch.no_grad():  # move the policy so that some ratios leave the trust region
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    loss, stats = appo.appo_loss(appo.BehaviourAgent(model), mb, cfg)
    logits, value = model(mb[K.OBS_FRAME])
    log_probs = logits.log_softmax(-1)
    logp = log_probs.gather(1, mb[K.STORED_ACTION].unsqueeze(1)).squeeze(1)
    ratio = (logp - mb[K.STORED_LOGP]).exp()  # pi / mu
    adv = (mb["advantage"] - mb["advantage"].mean()) / (mb["advantage"].std(correction=0) + 1e-8)
    policy = -torch.min(ratio * adv, ratio.clamp(0.9, 1.1) * adv).mean()
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    expected = policy + 0.7 * 0.5 * (value - mb["target"]).square().mean() - 0.1 * entropy
    torch.testing.assert_close(loss, expected)
    clipped = float(((ratio - 1).abs() > 0.1).float().mean())
    assert 0.0 < clipped < 1.0 and float(stats["clip_fraction"]) == pytest.approx(clipped)


def test_the_learner_takes_epochs_of_minibatch_steps_anneals_and_publishes_copies():
    model, trajs = segments(3)
    cfg = appo.Config(n_epochs=3, minibatch_size=10, max_frames=100)
    learner = appo.Learner(appo.BehaviourAgent(model), cfg, torch.device("cpu"))
    assert learner.weights.take() is None
    stats = learner(trajs[0])
    n = int(trajs[0].lengths.sum())
    steps = learner.optimizer.state_dict()["state"][0]["step"]
    assert steps == 3 * -(-n // 10)  # n_epochs * ceil(N / minibatch_size)
    assert stats["lr"] == pytest.approx(cfg.lr * (1 - n / 100))
    assert {"policy_loss", "value_loss", "entropy", "clip_fraction", "rho_mean"} <= set(stats)
    weights = learner.weights.take()
    assert weights is not None and learner.weights.take() is None
    for k, v in model.state_dict().items():  # a copy: the next step does not change it
        assert torch.equal(weights[k], v) and weights[k].data_ptr() != v.data_ptr()
    learner(trajs[1])
    assert learner.optimizer.param_groups[0]["lr"] == cfg.lr * max(0.0, 1 - 2 * n / 100)


SMOKE = ["--max-frames", "3000", "--n-envs", "4", "--n-timesteps", "16", "--eval-every", "5",
         "--seed", "0"]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("queue", [0, 1])
def test_smoke_run_from_another_folder_writes_a_complete_run_dir(queue, tmp_path):
    run_dir, stdout = run_algo("appo", [*SMOKE, "--queue", str(queue)], cwd=tmp_path)
    rows = check_run_dir(run_dir)
    assert int(rows[-1]["frames"]) >= 3000 and "appo: stopped by max_frames" in stdout
    assert evaluated_rows(rows)
    assert {"policy_loss", "clip_fraction", "rho_mean", "lr"} <= set(rows[-1])
    if queue:  # the learner thread's columns
        learned = [float(r["learned"]) for r in rows if r["learned"] != "nan"]
        assert learned[-1] >= len(learned) - 3  # it keeps up (the last row: the summary)
    else:
        assert "learned" not in rows[-1]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_learns_cartpole_on_a_frame_budget(tmp_path):
    # Solving (10 seeds, time to solve) is measured by benchmarks/learning.py; this checks
    # learning on a frame budget: random play returns about 22; APPO with its defaults solved
    # 475 in about 30-40k frames in the development runs (docs/algorithms.md).
    summary = appo.main(appo.Config(max_frames=50_000, time_budget=200, target_return=None,
                                    runs_dir=str(tmp_path), eval_every=0))
    assert summary["frames"] >= 50_000, summary
    rows = check_run_dir(Path(summary["run_dir"]))
    best = max(float(r["train_return_mean20"]) for r in rows if r["train_return_mean20"] != "nan")
    assert best >= 200, best
    entropy = [float(r["entropy"]) for r in rows if r["entropy"] not in ("", "nan")]
    assert min(entropy) > 0.05, min(entropy)  # no collapse to a deterministic policy


# ------------------------------------------------------------------------------ the model zoo
def test_the_model_flag_takes_every_model_of_the_zoo():
    assert typing.get_args(typing.get_type_hints(appo.Config)["model"]) == zoo.MODELS


def recurrent_segments(n: int = 3, t: int = 8) -> tuple[torch.nn.Module, list]:
    torch.manual_seed(0)
    model = zoo.actor_critic("mlp-lstm", (2,), space_spec(spaces.Discrete(2)), 16)
    with torch.no_grad():  # a policy far from uniform (the head's initial gain is 0.01)
        for p in model.actor.parameters():
            p.mul_(100.0)
    return model, collect(appo.BehaviourAgent, model, n_segments=n, n_timesteps=t,
                          env="rlstruct/CartPoleNoVel-v1")


def test_a_recurrent_batch_keeps_its_rows_and_replays_the_behaviour_policy():
    model, trajs = recurrent_segments()
    traj, agent = trajs[-1], appo.BehaviourAgent(model)
    batch, rho = appo.vtrace_batch(agent, traj, appo.Config())
    assert isinstance(batch, Trajectories) and torch.equal(batch.info["agent_state/h"],
                                                          traj.info["agent_state/h"])
    torch.testing.assert_close(rho, torch.ones_like(rho))  # replayed from the stored state
    rows = [mb.n_elems() for mb in vr.minibatches(batch, 16, 8)]
    assert rows == [2, 2]  # minibatches of whole rows: 16 transitions / T = 8
    loss, stats = appo.appo_loss(agent, batch.index(torch.tensor([1, 3])), appo.Config())
    assert float(stats["clip_fraction"]) == 0.0  # pi = mu: every ratio is 1
    loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if ".core.cell." in n)


def test_the_recurrent_learner_steps_per_row_minibatch_and_publishes_only_weights():
    model, trajs = recurrent_segments()
    cfg = appo.Config(model="mlp-lstm", n_epochs=2, minibatch_size=16, n_timesteps=8)
    learner = appo.Learner(appo.BehaviourAgent(model), cfg, torch.device("cpu"))
    stats = learner(trajs[-1])
    assert learner.optimizer.state_dict()["state"][0]["step"] == 2 * 2  # 4 rows, 2 per step
    assert stats["rho_mean"] == pytest.approx(1.0)
    weights = learner.weights.take()
    assert weights is not None and set(weights) == set(model.state_dict())


def test_recurrent_minibatches_of_partial_segments_are_refused():
    with pytest.raises(ConfigError, match=r"minibatch_size \(100\) must be a multiple of "
                                          r"n_timesteps \(32\)"):
        resolve(appo.Config(model="mlp-gru", minibatch_size=100, n_timesteps=32))
    with pytest.raises(ConfigError, match=r"the 6 rows of a segment .* minibatches of 4 rows"):
        resolve(appo.Config(model="mlp-gru", minibatch_size=128, n_timesteps=32,
                            layout=LayoutConfig(pipeline=2, n_processes=2, n_envs=3)))
    assert appo.Config(model="mlp-gru").problems() == []  # the defaults: 256 / 32 into 2 x 16
    assert appo.Config(minibatch_size=100).problems() == []  # feed-forward: any size


def test_a_cnn_on_flat_observations_is_refused_before_a_run_folder_exists(tmp_path):
    with pytest.raises(ConfigError, match=r"--model cnn-gru takes image frames"):
        appo.main(appo.Config(model="cnn-gru", runs_dir=str(tmp_path)))
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(120)
def test_a_recurrent_model_runs_a_few_iterations_on_cartpole_novel(tmp_path):
    summary = appo.main(appo.Config(
        env_id="rlstruct/CartPoleNoVel-v1", model="mlp-gru", n_timesteps=16, minibatch_size=32,
        n_epochs=2, max_frames=512, layout=LayoutConfig(pipeline=2, n_processes=1, n_envs=4),
        eval_every=0, target_return=None, runs_dir=str(tmp_path)))
    assert summary["frames"] >= 512 and summary["stopped_by"] == "max_frames"
    rows = check_run_dir(Path(summary["run_dir"]))
    assert {"policy_loss", "clip_fraction", "rho_mean"} <= set(rows[0])
    latest = torch.load(Path(summary["run_dir"]) / "checkpoints" / "latest.pt")
    assert latest["config"]["model"] == "mlp-gru"


# ------------------------------------------------------------------------------ Atari preset
def test_the_atari_preset_names_pong_and_resolves():
    cfg = appo.Config.from_preset("atari")
    assert (cfg.env_id, cfg.env_backend, cfg.model) == ("PongNoFrameskip-v4", "atari", "cnn")
    assert cfg.problems() == []


@pytest.mark.timeout(240)
def test_the_atari_preset_runs_a_few_iterations(tmp_path):
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install -e '.[atari]'")
    pytest.importorskip("cv2", reason="needs the atari extra: pip install -e '.[atari]'")
    cfg = appo.Config.from_preset("atari", n_processes=1, n_envs=2, n_timesteps=16,
                                  minibatch_size=16, max_frames=96, learner_device="cpu",
                                  runs_dir=str(tmp_path))
    summary = appo.main(cfg)
    assert summary["frames"] >= 96 and summary["stopped_by"] == "max_frames"
    latest = torch.load(Path(summary["run_dir"]) / "checkpoints" / "latest.pt")
    assert "trunk.0.weight" in latest["model"]

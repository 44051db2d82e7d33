"""rlstruct/algos/impala.py: the V-trace loss written out, the learner thread's publications, a
smoke run, a learning test, the configuration checks and the GPU layout; the zoo's recurrent
models replayed from their stored state; the Atari preset."""

from __future__ import annotations

import re
import typing
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces
from support.algo_runs import check_run_dir, evaluated_rows, run_algo
from support.trajectory_builders import collect

from rlstruct import CheckDevice, DictTensor, Trajectories, load_policy
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.algos import impala
from rlstruct.blocks import zoo
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.optim import RMSpropTF, adam
from rlstruct.blocks.recurrent import RecurrentAgent
from rlstruct.blocks.sampling import ActorAgent
from rlstruct.blocks.vtrace_replay import replay_segment
from rlstruct.errors import ConfigError, DeviceContractError, LearnerError
from rlstruct.learners.local import LocalLearner
from rlstruct.learners.rank import algorithm_learn
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import resolve


def segments(n: int = 2) -> tuple[torch.nn.Module, list]:
    torch.manual_seed(0)
    model = zoo.actor_critic("mlp", (4,), space_spec(spaces.Discrete(2)), 16)
    return model, collect(impala.BehaviourAgent, model, n_segments=n, n_timesteps=8)


def test_loss_matches_vtrace_written_out_and_is_on_policy_when_nothing_changed():
    model, (traj, _) = segments()
    cfg = impala.Config(normalize_advantages=False, ent_coef=0.1)
    loss, stats = impala.vtrace_loss(impala.BehaviourAgent(model), traj, cfg)
    steps = traj.trajectories
    b, t = steps.lengths.shape[0], steps.n_timesteps()
    with torch.no_grad():
        logits, value = model(steps[K.OBS_FRAME].flatten(0, 1))
        _, next_value = model(steps[K.NEXT_FRAME].flatten(0, 1))
    log_probs = logits.view(b, t, -1).log_softmax(-1)
    logp = log_probs.gather(2, steps[K.STORED_ACTION].unsqueeze(2)).squeeze(2)
    torch.testing.assert_close(logp[steps.mask()], steps[K.STORED_LOGP][steps.mask()])
    targets, adv = F.vtrace(
        steps[K.NEXT_REWARD], value.view(b, t), next_value.view(b, t),
        steps["_observation/terminated"], steps["_observation/truncated"], steps.lengths,
        torch.zeros(b, t), cfg.gamma, cfg.rho_bar, cfg.c_bar,
    )
    mask = steps.mask()
    entropy = F.masked_mean(-(log_probs.exp() * log_probs).sum(-1), mask)
    expected = (F.masked_mean(-logp * adv, mask)
                + cfg.vf_coef * F.masked_mean(0.5 * (value.view(b, t) - targets).square(), mask)
                - cfg.ent_coef * entropy)
    torch.testing.assert_close(loss, expected)
    assert stats["rho_mean"] == pytest.approx(1.0) and stats["rho_clipped"] == 0.0


def test_stale_behaviour_policies_are_corrected_by_clipped_importance_weights():
    model, (traj, _) = segments()
    with torch.no_grad():
        traj.trajectories[K.STORED_LOGP] = traj.trajectories[K.STORED_LOGP] - 1.0  # rho = e
    _loss, stats = impala.vtrace_loss(impala.BehaviourAgent(model), traj, impala.Config())
    assert stats["rho_mean"] == pytest.approx(float(torch.e), rel=1e-4)
    assert stats["rho_clipped"] == 1.0


def local_learner(model, make_agent):
    """IMPALA's one-rank learner group, as Run.learner_group builds it."""
    cfg = impala.Config()
    return LocalLearner(model, partial(adam, lr=cfg.lr, eps=1e-5),
                        partial(algorithm_learn, learn=impala.learn, make_agent=make_agent,
                                cfg=cfg), torch.device("cpu"))


def test_the_learner_steps_publishes_copies_and_counts_them():
    model, trajs = segments(3)
    learner = impala.Learner(local_learner(model, impala.BehaviourAgent))
    assert learner.weights.take() is None
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = learner(trajs[0])
    weights = learner.weights.take()
    assert weights is not None and learner.weights.take() is None
    assert any(not torch.equal(weights[k], before[k]) for k in before)
    for k, v in model.state_dict().items():  # a copy: the next step does not change it
        assert torch.equal(weights[k], v) and weights[k].data_ptr() != v.data_ptr()
    assert {"policy_loss", "value_loss", "entropy", "rho_mean"} <= set(stats)


class _MetaReplay(ActorAgent):
    """Acts correctly, but its replay returns logits and values on the meta device: a planted
    device mistake in the loss."""

    def call_replay(self, trajectories, t, state):
        out, state = super().call_replay(trajectories, t, state)
        return out.to("meta"), state


def _meta_behaviour_agent(model):
    return _MetaReplay(model, store_value=False, replay_next_value=True)


CAUGHT_BY_CHECK_DEVICE = r"action\['logits'\] is on meta, expected cpu \(CheckDevice around _Meta"


def test_the_loss_replays_the_agent_it_is_given_so_check_device_sees_a_planted_wrong_device():
    model, (traj,) = segments(1)
    learner = impala.Learner(local_learner(
        model, lambda m: CheckDevice(_meta_behaviour_agent(m), "cpu")))
    with pytest.raises(DeviceContractError, match=CAUGHT_BY_CHECK_DEVICE):
        learner(traj)
    assert learner.weights.take() is None  # no step was taken, nothing published


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_check_devices_catches_a_planted_wrong_device_in_the_loss(tmp_path, monkeypatch):
    monkeypatch.setattr(impala, "BehaviourAgent", _meta_behaviour_agent)
    cfg = impala.Config(layout=LayoutConfig(pipeline=2, n_envs=4, check_devices=True),
                        n_timesteps=16, max_frames=3000, eval_every=0, runs_dir=str(tmp_path))
    with pytest.raises(LearnerError) as err:  # raised in the learner thread, re-raised by put
        impala.main(cfg)
    assert isinstance(err.value.__cause__, DeviceContractError), err.value
    assert re.search(CAUGHT_BY_CHECK_DEVICE, str(err.value.__cause__)), err.value.__cause__


def test_config_refuses_a_synchronous_layout():
    with pytest.raises(ConfigError, match="--pipeline >= 2"):
        resolve(impala.Config(layout=LayoutConfig(pipeline=1)))
    assert impala.Config().layout.pipeline == 2


SMOKE = ["--max-frames", "3000", "--n-envs", "4", "--n-timesteps", "16", "--eval-every", "5",
         "--seed", "0"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_smoke_run_from_another_folder_writes_a_complete_run_dir(tmp_path):
    run_dir, stdout = run_algo("impala", SMOKE, cwd=tmp_path)
    rows = check_run_dir(run_dir)
    assert int(rows[-1]["frames"]) >= 3000 and "impala: stopped by max_frames" in stdout
    assert evaluated_rows(rows)
    assert {"policy_loss", "value_loss", "rho_mean", "learned", "queue"} <= set(rows[-1])
    learned = [float(r["learned"]) for r in rows if r["learned"] != "nan"]
    assert learned[-1] >= len(learned) - 3  # the learner keeps up (the last row: the summary)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_learns_cartpole(tmp_path):
    # Solving (3/3 seeds, time to solve) is measured by benchmarks/learning.py; this checks
    # learning on a frame budget: random play returns about 22, IMPALA passes 100 by about
    # 100k frames (it solves CartPole with 0.5-1M).
    summary = impala.main(impala.Config(max_frames=150_000, time_budget=150, target_return=None,
                                        runs_dir=str(tmp_path), eval_every=0))
    assert summary["frames"] >= 150_000, summary
    rows = check_run_dir(Path(summary["run_dir"]))
    best = max(float(r["train_return_mean20"]) for r in rows if r["train_return_mean20"] != "nan")
    assert best >= 100, best


@pytest.mark.gpu
def test_gpu_learner(tmp_path):
    cfg = impala.Config(layout=LayoutConfig(learner_device="cuda:0", n_envs=4, pipeline=2),
                        max_frames=3000, eval_every=2, runs_dir=str(tmp_path))
    check_run_dir(Path(impala.main(cfg)["run_dir"]))


# ------------------------------------------------------------------------------ the model zoo
def test_the_model_flag_takes_every_model_of_the_zoo():
    assert typing.get_args(typing.get_type_hints(impala.Config)["model"]) == zoo.MODELS


def recurrent_segments(model_name: str, n: int = 3, t: int = 8) -> tuple[torch.nn.Module, list]:
    """``n`` consecutive segments of rlstruct/CartPoleNoVel-v1 played by a recurrent model:
    the later ones start from a non-zero stored state and hold episode starts inside."""
    torch.manual_seed(0)
    model = zoo.actor_critic(model_name, (2,), space_spec(spaces.Discrete(2)), 16)
    with torch.no_grad():  # a policy far from uniform (the head's initial gain is 0.01)
        for p in model.actor.parameters():
            p.mul_(100.0)
    return model, collect(impala.BehaviourAgent, model, n_segments=n, n_timesteps=t,
                          env="rlstruct/CartPoleNoVel-v1")


@pytest.mark.parametrize("model_name", ["mlp-lstm", "mlp-gru"])
def test_the_learner_replays_the_behaviour_logp_from_the_stored_state(model_name):
    model, trajs = recurrent_segments(model_name, n=4, t=12)
    agent = impala.BehaviourAgent(model)
    assert isinstance(agent, RecurrentAgent)
    traj = trajs[-1]
    steps, start = traj.trajectories, traj.info["agent_state/h"]
    assert bool(start.abs().sum(-1).gt(0).all())  # the memory the actors had, not zeros
    assert bool(steps[K.OBS_INITIAL_STATE][:, 1:].any())  # episodes start inside the segment
    logits, value, next_value = replay_segment(agent, traj)
    logp = F.categorical_log_prob(logits, steps[K.STORED_ACTION])
    mask = steps.mask()
    torch.testing.assert_close(logp[mask], steps[K.STORED_LOGP][mask])  # rho = 1
    assert logits.requires_grad and value.requires_grad and not next_value.requires_grad
    inside = ~(steps[K.NEXT_TERMINATED] | steps[K.NEXT_TRUNCATED])[:, :-1]
    torch.testing.assert_close(next_value[:, :-1][inside], value[:, 1:][inside].detach())
    _loss, stats = impala.vtrace_loss(agent, traj, impala.Config())
    assert stats["rho_mean"] == pytest.approx(1.0) and stats["rho_clipped"] == 0.0
    # from zeros (not the stored state) the replay would not be the behaviour policy
    fresh = Trajectories(DictTensor({"agent_state/h": torch.zeros_like(start)}), steps)
    stale = F.categorical_log_prob(replay_segment(agent, fresh)[0], steps[K.STORED_ACTION])
    assert not torch.allclose(stale[mask], steps[K.STORED_LOGP][mask])


def test_a_recurrent_learner_steps_through_the_cell_and_publishes_only_the_weights():
    model, trajs = recurrent_segments("mlp-lstm")
    learner = impala.Learner(local_learner(model, impala.BehaviourAgent))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = learner(trajs[-1])
    weights = learner.weights.take()
    assert weights is not None and set(weights) == set(before)  # nothing new: no agent state
    cell = [k for k in before if ".core.cell." in k]
    assert cell and all(not torch.equal(weights[k], before[k]) for k in cell)
    assert stats["rho_mean"] == pytest.approx(1.0)


def test_summed_losses_are_the_averaged_ones_times_the_valid_steps():
    model, (traj, _) = segments()
    agent, n = impala.BehaviourAgent(model), int(traj.lengths.sum())
    mean, _ = impala.vtrace_loss(agent, traj, impala.Config(normalize_advantages=False))
    total, _ = impala.vtrace_loss(agent, traj, impala.Config(normalize_advantages=False,
                                                             reduction="sum"))
    torch.testing.assert_close(total, mean * n)


def test_bad_model_combinations_are_refused_before_a_run_folder_exists(tmp_path):
    with pytest.raises(ConfigError, match=r"--model cnn-lstm takes image frames .*\(4,\)"):
        impala.main(impala.Config(model="cnn-lstm", runs_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match=r"'transformer' is not one of"):
        resolve(impala.Config(model="transformer"))  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(120)
def test_a_recurrent_model_runs_a_few_iterations_on_cartpole_novel(tmp_path):
    summary = impala.main(impala.Config(
        env_id="rlstruct/CartPoleNoVel-v1", model="mlp-gru", n_timesteps=16, max_frames=640,
        layout=LayoutConfig(pipeline=2, n_processes=1, n_envs=4), eval_every=0,
        target_return=None, runs_dir=str(tmp_path), progress_every_s=0.0))  # a row each
    assert summary["frames"] >= 640 and summary["stopped_by"] == "max_frames"
    rows = check_run_dir(Path(summary["run_dir"]))
    assert max(float(r["learned"]) for r in rows if r["learned"] != "nan") >= 3
    latest = torch.load(Path(summary["run_dir"]) / "checkpoints" / "latest.pt")
    assert latest["config"]["model"] == "mlp-gru" and any(".core.cell." in k
                                                          for k in latest["model"])
    policy = load_policy(summary["run_dir"], seed=0)  # rebuilt from the checkpoint alone
    assert policy.recurrent and policy.act(np.zeros((3, 2), np.float32)).shape == (3,)


# ------------------------------------------------------------------------------ Atari preset
def test_the_atari_preset_is_torchbeast_s_and_resolves():
    cfg = impala.Config.from_preset("atari")
    assert (cfg.env_id, cfg.env_backend, cfg.model) == ("PongNoFrameskip-v4", "atari", "cnn")
    assert (cfg.n_timesteps, cfg.layout.n_processes * cfg.layout.n_envs) == (80, 8)
    assert (cfg.lr, cfg.optimizer, cfg.ent_coef, cfg.max_grad_norm) == (4.8e-4, "rmsprop",
                                                                         0.0006, 40.0)
    assert cfg.clip_reward and cfg.reduction == "sum" and cfg.problems() == []
    optimizer = impala.make_optimizer(cfg)([torch.zeros(2, requires_grad=True)], device="cpu")
    assert isinstance(optimizer, torch.optim.RMSprop)
    assert {k: optimizer.defaults[k] for k in ("alpha", "eps", "momentum")} == {
        "alpha": 0.99, "eps": 0.01, "momentum": 0}


def test_rmsprop_tf_is_the_papers_rmsprop_eps_inside_the_root_from_a_square_average_of_ones():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    make = impala.make_optimizer(impala.Config(optimizer="rmsprop-tf", lr=0.1))
    optimizer = make([w], device="cpu")
    assert isinstance(optimizer, RMSpropTF)
    assert {k: optimizer.defaults[k] for k in ("alpha", "eps")} == {"alpha": 0.99, "eps": 0.01}
    w.grad = torch.tensor([3.0, 0.0])
    optimizer.step()  # v = 0.99 + 0.01 g^2 (torch's RMSprop: v = 0.01 g^2, a 10x larger step)
    assert torch.allclose(w.detach(), torch.tensor([1.0 - 0.1 * 3.0 / (0.99 + 0.09 + 0.01) ** 0.5,
                                                    -2.0]))


@pytest.mark.timeout(240)
def test_the_atari_preset_runs_a_few_iterations(tmp_path):
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install -e '.[atari]'")
    pytest.importorskip("cv2", reason="needs the atari extra: pip install -e '.[atari]'")
    cfg = impala.Config.from_preset("atari", n_processes=1, n_envs=2, n_timesteps=16,
                                    max_frames=96, learner_device="cpu", runs_dir=str(tmp_path))
    summary = impala.main(cfg)
    assert summary["frames"] >= 96 and summary["stopped_by"] == "max_frames"
    latest = torch.load(Path(summary["run_dir"]) / "checkpoints" / "latest.pt")
    assert "trunk.0.weight" in latest["model"] and latest["config"]["optimizer"] == "rmsprop"
    assert "square_avg" in next(iter(latest["optimizer"]["state"].values()))  # RMSprop's

"""rlstruct/algos/impala.py: the V-trace loss written out, the learner thread's publications, a
smoke
run, a learning test, the configuration checks and the GPU layout."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest
import torch
from support.algo_runs import check_run_dir, evaluated_rows, run_algo
from support.trajectory_builders import collect

from rlstruct import CheckDevice
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.algos import impala
from rlstruct.blocks.optim import adam
from rlstruct.blocks.sampling import ActorAgent
from rlstruct.errors import ConfigError, DeviceContractError, LearnerError
from rlstruct.learners.local import LocalLearner
from rlstruct.learners.rank import algorithm_learn
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import resolve


def segments(n: int = 2) -> tuple[impala.ActorCritic, list]:
    torch.manual_seed(0)
    model = impala.ActorCritic(obs_dim=4, n_actions=2, hidden=16)
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

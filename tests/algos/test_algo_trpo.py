"""rlstruct/algos/trpo.py: the Fisher-vector product, the trust region held after every update, the
line search's refusal, smoke runs, and learning Pendulum."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from gymnasium import spaces
from support.algo_runs import check_run_dir, evaluated_rows, run_algo
from torch.nn.utils import parameters_to_vector

from rlstruct import SerialBatcher
from rlstruct.algos import trpo
from rlstruct.blocks.distributions import make_head
from rlstruct.blocks.nets import HeadActorCritic
from rlstruct.blocks.sampling import PolicyAgent
from rlstruct.envs import GymEnvInf
from rlstruct.errors import ConfigError
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import resolve

PENDULUM_ACTIONS = spaces.Box(-2.0, 2.0, (1,))


def _model(space=PENDULUM_ACTIONS, obs_dim=3, hidden=16, normalize_obs=True):
    return HeadActorCritic(obs_dim, make_head(space, hidden), hidden, normalize_obs)


def test_fisher_vector_product_is_the_hessian_of_the_mean_kl():
    torch.manual_seed(0)
    model = _model(hidden=4, normalize_obs=False).double()
    x = torch.randn(20, 3, dtype=torch.float64)
    params = list(model.actor.parameters())
    theta = parameters_to_vector(params).detach()
    with torch.no_grad():
        params_old = model.actor(x)

    names = [name for name, _ in model.actor.named_parameters()]

    def kl_at(flat):
        pieces = flat.split([p.numel() for p in params])
        weights = {n: w.view_as(p) for n, w, p in zip(names, pieces, params)}
        new = torch.func.functional_call(model.actor, weights, (x,))
        return model.head.kl(params_old, new).mean()

    hessian = torch.autograd.functional.hessian(kl_at, theta)
    fvp = trpo.fisher_vector_product(model, x, params_old, damping=0.1)
    v = torch.randn_like(theta)
    torch.testing.assert_close(fvp(v), hessian @ v + 0.1 * v)


@pytest.mark.parametrize("env,obs_dim,space", [
    ("Pendulum-v1", 3, PENDULUM_ACTIONS), ("CartPole-v1", 4, spaces.Discrete(2)),
])
def test_every_update_keeps_the_measured_kl_within_the_trust_region(env, obs_dim, space):
    torch.manual_seed(0)
    cfg = trpo.Config(max_kl=0.01, critic_epochs=1)
    model = _model(space, obs_dim)
    optimizer = torch.optim.Adam(model.critic.parameters(), lr=cfg.lr)
    kls = []
    with SerialBatcher(32, PolicyAgent, {"model": model}, GymEnvInf,
                       {"env": env, "n_envs": 8}) as batcher:
        batcher.reset()
        for _ in range(6):
            batcher.execute()
            traj, _ = batcher.get()
            old_actor = copy.deepcopy(model.actor)
            stats = trpo.learn(model, optimizer, traj, cfg)
            with torch.no_grad():  # measured on the batch's states, with the new statistics
                x = model.features(traj.trajectories.get(["observation/frame"])
                                   .to_transitions()["observation/frame"])
                kl = float(model.head.kl(old_actor(x), model.actor(x)).mean())
            assert kl <= 1.5 * cfg.max_kl, (kl, stats)
            assert stats["kl"] == pytest.approx(kl, rel=1e-4, abs=1e-7)
            kls.append(kl)
            batcher.update(model.state_dict())
    assert sum(k > 0 for k in kls) >= 4, kls  # the policy did move


def test_the_line_search_keeps_pi_old_when_no_step_improves_the_surrogate():
    torch.manual_seed(0)
    model = _model(normalize_obs=False)
    x, sample = torch.randn(64, 3), torch.randn(64, 1)
    before = parameters_to_vector(model.actor.parameters()).clone()
    stats = trpo.policy_step(model, x, sample, torch.zeros(64), trpo.Config())
    assert stats == {"kl": 0.0, "improvement": 0.0, "line_search": 10}
    assert torch.equal(parameters_to_vector(model.actor.parameters()), before)


def test_a_policy_step_improves_the_surrogate_inside_the_trust_region():
    torch.manual_seed(1)
    model = _model(normalize_obs=False)
    x, sample, adv = torch.randn(256, 3), torch.randn(256, 1), torch.randn(256)
    stats = trpo.policy_step(model, x, sample, adv, trpo.Config(max_kl=0.02))
    assert stats["improvement"] > 0 and 0 < stats["kl"] <= 0.02


def test_config_lists_every_problem():
    with pytest.raises(ConfigError) as info:
        resolve(trpo.Config(max_kl=0.0, cg_iters=0, backtrack=1.0, minibatch_size=0))
    for name in ("max_kl", "cg_iters", "backtrack", "minibatch_size"):
        assert name in str(info.value)


def test_reward_normalisation_takes_one_learner():
    with pytest.raises(ConfigError, match="--normalize-reward takes one learner"):
        resolve(trpo.Config(normalize_reward=True, layout=LayoutConfig(n_learners=2)))


def layout(**kw) -> LayoutConfig:
    return LayoutConfig(**{"learner_device": "cpu", "n_processes": 1, "n_envs": 2, **kw})


def test_torch_env_backend_runs_pendulum_in_the_learners_process(tmp_path):
    cfg = trpo.Config(layout=layout(n_envs=16), env_backend="torch", n_timesteps=32,
                      max_frames=2000, eval_every=0, critic_epochs=1, runs_dir=str(tmp_path))
    run_dir = Path(trpo.main(cfg)["run_dir"])
    rows = check_run_dir(run_dir)
    assert int(rows[-1]["frames"]) >= 2000 and {"kl", "value_loss"} <= set(rows[-1])
    checkpoint = torch.load(run_dir / "checkpoints" / "latest.pt")
    assert float(checkpoint["model"]["obs_norm.count"]) >= 1500  # the statistics are saved
    assert json.loads((run_dir / "config.json").read_text())["config"]["max_kl"] == 0.01


def test_reward_normalisation_scales_the_critics_targets(tmp_path):
    # rl-zoo's TRPO runs under VecNormalize(norm_reward=True): the returns' statistics are kept
    # from every valid step and saved with the model, and the critic learns the scaled returns
    # (Pendulum's rewards, -16 to 0 a step, give a value loss in the hundreds unscaled).
    losses = {}
    for normalize in (False, True):
        cfg = trpo.Config(layout=layout(n_envs=16), env_backend="torch", n_timesteps=32,
                          max_frames=2000, eval_every=0, critic_epochs=1,
                          normalize_reward=normalize, runs_dir=str(tmp_path / str(normalize)))
        run_dir = Path(trpo.main(cfg)["run_dir"])
        weights = torch.load(run_dir / "checkpoints" / "latest.pt")["model"]
        assert ("reward_norm.count" in weights) == normalize
        losses[normalize] = float(check_run_dir(run_dir)[-1]["value_loss"])
    assert float(weights["reward_norm.count"]) >= 1500
    assert losses[True] < losses[False] / 10, losses


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_smoke_run_with_workers_and_evaluation(tmp_path):
    args = ["--max-frames", "3000", "--n-envs", "2", "--n-timesteps", "64", "--eval-every", "2",
            "--critic-epochs", "1"]
    run_dir, stdout = run_algo("trpo", args, cwd=tmp_path)
    rows = check_run_dir(run_dir)
    assert "trpo: stopped by max_frames" in stdout and evaluated_rows(rows)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_learns_pendulum(tmp_path):
    # A random policy scores about -1200 to -1500 per episode; -400 is a clear swing-up.
    cfg = trpo.Config(layout=layout(n_envs=16), env_backend="torch", eval_every=0,
                      target_return=-400.0, max_frames=200_000, time_budget=120,
                      runs_dir=str(tmp_path))
    summary = trpo.main(cfg)
    assert summary["solved"], summary


@pytest.mark.gpu
def test_gpu_layout_with_torch_pendulum_on_the_gpu(tmp_path):
    cfg = trpo.Config(
        layout=LayoutConfig(learner_device="cuda:0", batcher_device="cuda", eval_device="cpu",
                            n_envs=64, check_devices=True),
        env_backend="torch", n_timesteps=32, max_frames=10**9, time_budget=20, eval_every=1,
        critic_epochs=1, runs_dir=str(tmp_path),
    )
    # A time budget, not frames: on a GPU 6,000 frames take under a second, less than the CPU
    # evaluation worker needs to start, and a run drops the evaluation still in flight.
    rows = check_run_dir(Path(trpo.main(cfg)["run_dir"]))
    assert evaluated_rows(rows) and all(float(r["kl"]) <= 1.5 * cfg.max_kl for r in rows[:-1])

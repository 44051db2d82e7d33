"""SAC and TRPO with ``--n-learners``: SAC's ranks on half the rows of each stacked buffer sample
equal one learner on the whole samples (twin critics, targets, actor, temperature); TRPO's ranks
on half the trajectories equal one learner on all of them (policy, critic, observation
statistics), inside the trust region; both run from the command line with two ranks."""

from __future__ import annotations

import sys
from functools import partial

import gymnasium as gym
import pytest
import torch

from rlstruct import DictTensor, SerialBatcher
from rlstruct import keys as K
from rlstruct.algos import sac, trpo
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.nets import head_actor_critic
from rlstruct.blocks.optim import adam, gradient_step
from rlstruct.blocks.sampling import PolicyAgent
from rlstruct.envs import GymEnvInf
from rlstruct.errors import ConfigError
from rlstruct.learners.base import under
from rlstruct.learners.group import LearnerGroup
from rlstruct.learners.rank import RankContext, algorithm_learn
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import resolve

N_ROWS, N_SAMPLES = 32, 3


def _samples(seed: int = 3) -> DictTensor:
    """``N_SAMPLES`` Pendulum-like buffer samples stacked ``(N_ROWS, N_SAMPLES, ...)``, with the
    reparameterisation noise the driver draws for the ranks."""
    g = torch.Generator().manual_seed(seed)
    samples = [DictTensor({
        K.OBS_FRAME: torch.randn(N_ROWS, 3, generator=g),
        sac.STORED_SQUASHED: torch.rand(N_ROWS, 1, generator=g) * 2 - 1,
        K.NEXT_FRAME: torch.randn(N_ROWS, 3, generator=g),
        K.NEXT_REWARD: torch.randn(N_ROWS, generator=g),
        K.NEXT_TERMINATED: torch.rand(N_ROWS, generator=g) < 0.2,
        K.NEXT_TRUNCATED: torch.rand(N_ROWS, generator=g) < 0.2,
    }) for _ in range(N_SAMPLES)]
    batch = DictTensor.stack(samples, dim=1)
    batch.set("noise", torch.randn(N_ROWS, N_SAMPLES, 2, 1, generator=g))
    return batch


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_sac_ranks_on_half_rows_equal_one_learner_on_all():
    cfg = sac.Config(batch_size=N_ROWS, hidden=16)
    make_nets = partial(sac.sac_nets, partial(sac.Actor, 3, space_spec(gym.spaces.Box(-2, 2, (1,))),
                                              16), partial(sac.TwinQ, 3, 1, 16), 0.5)
    torch.manual_seed(0)
    nets, batch = make_nets(), _samples()
    initial = {k: v.clone() for k, v in nets.state_dict().items()}
    learn = partial(algorithm_learn, learn=sac.learn, make_agent=None, cfg=cfg, stacked=True)
    with LearnerGroup(make_nets, partial(adam, lr=cfg.lr), learn, nets.state_dict(),
                      n_learners=2, devices=["cpu", "cpu"], timeout=60) as group:
        metrics = group.learn(batch)
        weights = {k: v.clone() for k, v in group.state_dict().items()}
        actor = group.state_dict("actor.")
        assert actor.keys() == nets.actor.state_dict().keys()  # what the workers load
        assert group.optimizer_state_dict()["state"][0]["step"] == N_SAMPLES
    assert metrics["n_allreduce"] == N_SAMPLES  # one averaged step per stacked sample
    torch.set_num_threads(1)
    optimizer = adam(nets.parameters(), cfg.lr, "cpu")
    for j in range(N_SAMPLES):  # one learner, the whole rows of each sample
        sac.learn(nets, optimizer, batch.apply(lambda v: v[:, j]), cfg)  # noqa: B023
    for part in ("actor.", "critic.", "target.", "temperature."):
        mine, theirs = under(weights, part), under(nets.state_dict(), part)
        assert mine and max(float((mine[k] - theirs[k]).abs().max()) for k in mine) < 1e-5, part
        moved = max(float((theirs[k] - under(initial, part)[k]).abs().max()) for k in theirs)
        assert moved > 1e-4, part  # it did learn


def test_sac_checks_rows_per_rank_and_trpo_takes_learner_ranks():
    with pytest.raises(ConfigError, match=r"batch_size \(33\) must be a multiple of n_learners"):
        resolve(sac.Config(batch_size=33, layout=LayoutConfig(n_learners=2)))
    trpo.Config(layout=LayoutConfig(n_learners=2, learner_devices="cpu,cpu"))


def test_a_lone_rank_context_leaves_tensors_alone():
    ctx = RankContext.of(gradient_step)  # what TRPO's learn sees without a group
    x, y = torch.randn(3, 2), torch.randn(4)
    assert ctx.world_size == 1 and RankContext.of().world_size == 1
    assert all(a is b for a, b in zip(ctx.all_reduce_mean(x, y, weight=3.0), (x, y)))
    assert ctx.all_gather_rows(x) is x and ctx.n_allreduce == 0
    group_ctx = RankContext(0, 1, torch.device("cpu"), torch.nn.Linear(2, 1))
    assert RankContext.of(group_ctx.step) is group_ctx  # what algorithm_learn hands learn


def _collectives_learn(ctx: RankContext, batch: DictTensor) -> dict[str, float]:
    x = batch["x"][: ctx.rank + 1]  # rank r keeps r + 1 of its rows: unequal counts
    whole = ctx.all_gather_rows(x)
    (mean,) = ctx.all_reduce_mean(x.mean(0), weight=x.shape[0])
    plain, ones = ctx.all_reduce_mean(torch.tensor(float(ctx.rank)), torch.ones(2, 3))
    return {"rows": whole.shape[0], "first": whole[0, 0], "last": whole[-1, 0],
            "middle": whole[1, 1], "weighted": mean[0], "plain": plain, "ones": ones.sum()}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_rank_collectives_gather_rows_in_rank_order_and_weigh_means():
    batch = DictTensor({"x": torch.arange(16.0).view(8, 2)})  # rank 0: rows 0-3, rank 1: 4-7
    make = partial(torch.nn.Linear, 2, 1)
    with LearnerGroup(make, partial(adam, lr=1e-3), _collectives_learn, make().state_dict(),
                      n_learners=2, devices=["cpu", "cpu"], timeout=60) as group:
        metrics = group.learn(batch)  # the ranks' metrics are averaged: equal if identical
    assert metrics["rows"] == 3 and metrics["n_allreduce"] == 3  # rows 0, 4 and 5
    assert (metrics["first"], metrics["middle"], metrics["last"]) == (0.0, 9.0, 10.0)
    assert metrics["weighted"] == pytest.approx((0 + 8 + 10) / 3)  # over the 3 rows
    assert metrics["plain"] == 0.5 and metrics["ones"] == 6.0


# ------------------------------------------------------------------------------------- TRPO
TRPO_CFG = trpo.Config(hidden=16, critic_epochs=3, minibatch_size=256, max_kl=0.02)
N_UPDATES = 3


def _trpo_model() -> torch.nn.Module:
    return head_actor_critic(3, space_spec(gym.spaces.Box(-2, 2, (1,))), 16, 0.0, True)


def _pendulum_batches(n: int = N_UPDATES) -> list:
    """``n`` batches of 8 Pendulum trajectories x 32 steps (256 rows: one critic minibatch,
    so that the minibatches do not depend on how the rows are split)."""
    torch.manual_seed(7)
    with SerialBatcher(32, PolicyAgent, {"model": _trpo_model()}, GymEnvInf,
                       {"env": "Pendulum-v1", "n_envs": 8}) as batcher:
        batcher.reset()
        out = []
        for _ in range(n):
            batcher.execute()
            out.append(batcher.get()[0])
    return out


def _kl(before: dict, after: dict, frames: torch.Tensor) -> float:
    """``mean KL(pi_before || pi_after)`` on ``frames``, with ``after``'s statistics."""
    old, new = _trpo_model(), _trpo_model()
    old.load_state_dict(before)
    new.load_state_dict(after)
    with torch.no_grad():
        x = new.features(frames)
        return float(new.head.kl(old.actor(x), new.actor(x)).mean())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_trpo_ranks_on_half_rows_equal_one_learner_on_all():
    batches = _pendulum_batches()
    torch.manual_seed(0)
    model = _trpo_model()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    n_critic = len(list(model.critic.parameters()))
    make_optimizer = partial(trpo.critic_adam, lr=TRPO_CFG.lr, n_critic=n_critic)
    learn = partial(algorithm_learn, learn=trpo.learn, make_agent=None, cfg=TRPO_CFG,
                    per_rank=("minibatch_size",))
    weights, kls = [initial], []
    with LearnerGroup(_trpo_model, make_optimizer, learn, model.state_dict(), n_learners=2,
                      devices=["cpu", "cpu"], timeout=60) as group:
        for traj in batches:
            metrics = group.learn(traj)
            weights.append({k: v.clone() for k, v in group.state_dict().items()})
            frames = traj.trajectories.get([K.OBS_FRAME]).to_transitions()[K.OBS_FRAME]
            kls.append(_kl(weights[-2], weights[-1], frames))  # measured on the whole batch
            assert metrics["kl"] == pytest.approx(kls[-1], rel=1e-4, abs=1e-7)
            assert metrics["n_allreduce"] > TRPO_CFG.cg_iters  # one per Fisher-vector product
        assert group.optimizer_state_dict()["state"][0]["step"] == N_UPDATES * 3
    assert all(0 < kl <= 1.5 * TRPO_CFG.max_kl for kl in kls), kls
    torch.set_num_threads(1)
    optimizer = make_optimizer(model.parameters(), "cpu")
    for traj in batches:  # one learner, all the rows of each batch
        trpo.learn(model, optimizer, traj, TRPO_CFG)
    for part in ("actor.", "critic.", "obs_norm."):
        mine, theirs = under(weights[-1], part), under(model.state_dict(), part)
        assert mine and max(float((mine[k] - theirs[k]).abs().max()) for k in mine) < 1e-5, part
        moved = max(float((theirs[k] - under(initial, part)[k]).abs().max()) for k in theirs)
        assert moved > 1e-4, part  # it did learn
    assert float(model.obs_norm.count) == N_UPDATES * 256  # every rank saw the whole batch's


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sac_runs_with_two_learner_ranks_from_the_command_line(tmp_path):
    from support.algo_runs import check_run_dir, run_algo

    run_dir, _ = run_algo("sac", ["--n-learners", "2", "--max-frames", "600", "--learning-starts",
                                  "300", "--eval-every", "0", "--learner-device", "cpu"],
                          cwd=tmp_path, timeout=240)
    rows = check_run_dir(run_dir)
    learned = [r for r in rows if r.get("n_allreduce") not in (None, "", "nan")]
    assert learned and all(float(r["allreduce_ms"]) > 0 for r in learned)
    updates = int(float(learned[-1]["updates"]))
    assert updates >= 32 and updates % 32 == 0  # the same n = 4 envs x 8 steps per batch
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    assert {k.split(".")[0] for k in state["learner"]} == {"actor", "critic", "target",
                                                           "temperature"}  # the ranks' nets
    actor = {k.removeprefix("actor."): v for k, v in state["learner"].items()
             if k.startswith("actor.")}
    assert state["model"].keys() == actor.keys()  # the policy, as evaluate rebuilds it
    assert all(torch.equal(state["model"][k], v) for k, v in actor.items())
    assert state["optimizer"]["state"][0]["step"] == updates


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trpo_runs_with_two_learner_ranks_from_the_command_line(tmp_path):
    from support.algo_runs import check_run_dir, run_algo

    run_dir, _ = run_algo("trpo", ["--n-learners", "2", "--max-frames", "4096", "--eval-every",
                                   "0", "--learner-device", "cpu", "--n-processes", "1",
                                   "--n-envs", "4", "--n-timesteps", "256",
                                   "--progress-every-s", "0"],  # a row each update (counted)
                          cwd=tmp_path, timeout=240)
    rows = check_run_dir(run_dir)
    learned = [r for r in rows if r.get("n_allreduce") not in (None, "", "nan")]
    assert len(learned) >= 3 and all(float(r["allreduce_ms"]) > 0 for r in learned)
    assert all(0 <= float(r["kl"]) <= 1.5 * trpo.Config().max_kl for r in learned)
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    count = float(state["model"]["obs_norm.count"])  # each update's 1024 rows, once
    assert count == 1024 * len(learned), count
    critic = len(list(_trpo_model().critic.parameters()))
    assert len(state["optimizer"]["param_groups"][0]["params"]) == critic  # the critic's Adam


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_trpo_is_one_run_of_two_ranks(tmp_path):
    from support.algo_runs import check_run_dir
    from test_learner_torchrun import ROOT, _run  # each command in its own, reaped, session

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "rlstruct.algos.trpo", "--max-frames", "4096", "--eval-every", "0",
           "--n-processes", "1", "--n-envs", "4", "--n-timesteps", "256",
           "--progress-every-s", "0", "--runs-dir", str(tmp_path / "runs")]  # a row each update
    [done] = _run([(cmd, {"PYTHONPATH": str(ROOT)})], cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout
    [run_dir] = (tmp_path / "runs").iterdir()  # one run: rank 0's
    learned = [r for r in check_run_dir(run_dir) if r.get("kl") not in (None, "", "nan")]
    assert len(learned) >= 3 and all(float(r["n_allreduce"]) > 10 for r in learned)
    assert all(0 < float(r["kl"]) <= 1.5 * trpo.Config().max_kl for r in learned)

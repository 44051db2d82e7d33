"""SAC and TRPO with ``--n-learners``: SAC's ranks on half the rows of each stacked buffer sample
equal one learner on the whole samples (twin critics, targets, actor, temperature); SAC runs
from the command line with two ranks; TRPO refuses them with a ConfigError that says why."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import pytest
import torch

from algos import sac, trpo
from rlstruct import DictTensor
from rlstruct import keys as K
from rlstruct.distributions import space_spec
from rlstruct.errors import ConfigError
from rlstruct.experiment import LayoutConfig
from rlstruct.learner_base import under
from rlstruct.learner_group import LearnerGroup
from rlstruct.learner_rank import algorithm_learn
from rlstruct.optim import adam

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
    make_nets = partial(sac.sac_nets, 3, space_spec(gym.spaces.Box(-2, 2, (1,))), 16, 0.5)
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


def test_sac_checks_rows_per_rank_and_trpo_refuses_learner_ranks():
    with pytest.raises(ConfigError, match=r"batch_size \(33\) must be a multiple of n_learners"):
        sac.Config(batch_size=33, layout=LayoutConfig(n_learners=2))
    for layout in (LayoutConfig(n_learners=2), LayoutConfig(learner_devices="cpu")):
        with pytest.raises(ConfigError, match=r"TRPO learns in one process.*guide-learners"):
            trpo.Config(layout=layout)
    trpo.Config(layout=LayoutConfig(n_learners=1))  # one learner: fine


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sac_runs_with_two_learner_ranks_from_the_command_line(tmp_path):
    from algo_runs import check_run_dir, run_algo

    run_dir, _ = run_algo("sac", ["--n-learners", "2", "--max-frames", "600", "--learning-starts",
                                  "300", "--eval-every", "0", "--learner-device", "cpu"],
                          cwd=tmp_path, timeout=240)
    rows = check_run_dir(run_dir)
    learned = [r for r in rows if r.get("n_allreduce") not in (None, "", "nan")]
    assert learned and all(float(r["allreduce_ms"]) > 0 for r in learned)
    updates = int(float(learned[-1]["updates"]))
    assert updates >= 32 and updates % 32 == 0  # the same n = 4 envs x 8 steps per batch
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    assert {k.split(".")[0] for k in state["model"]} == {"actor", "critic", "target",
                                                         "temperature"}  # the ranks' nets
    assert state["optimizer"]["state"][0]["step"] == updates

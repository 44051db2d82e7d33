"""rlstruct.learners.ray_group: learner ranks as Ray actors on the local loopback cluster (a head
node with 2 CPUs and a ``learner`` resource), beside nothing else: two ranks on half the rows each
equal one learner on the whole batch, and failures are named by rank. Skipped without Ray."""

from __future__ import annotations

import os

import cloudpickle
import pytest
import torch
from support import learner_fns
from support.learner_fns import toy_batch, toy_model
from support.processes import reap_non_ray_children

from rlstruct.errors import LearnerError

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")

from rlstruct.learners.ray_group import RayLearnerGroup  # noqa: E402

cloudpickle.register_pickle_by_value(learner_fns)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    """One loopback Ray cluster for this module: 2 CPUs, 2 units of a ``learner`` resource and
    one of ``rollout``."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    saved = os.environ.get("RAY_USAGE_STATS_ENABLED")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    flag, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    c = Cluster(initialize_head=True, connect=True, head_node_args={
        "num_cpus": 2, "resources": {"learner": 2, "rollout": 1}, "node_ip_address": "127.0.0.1",
        "include_dashboard": False})
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = flag
        if saved is None:
            os.environ.pop("RAY_USAGE_STATS_ENABLED", None)
        else:
            os.environ["RAY_USAGE_STATS_ENABLED"] = saved


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Replaces conftest.py's check: Ray's daemons and idle workers are the cluster fixture's,
    but no other process may be left (the tests check that no rank actor is left alive)."""
    yield
    reap_non_ray_children()


def _alive_ranks() -> list[str]:
    from ray._private import state

    return [a["ActorID"][:8] for a in state.actors().values()
            if a.get("ActorClassName") == "_Rank" and a.get("State") != "DEAD"]


def _group(learn, model, **kw) -> RayLearnerGroup:
    return RayLearnerGroup(toy_model, learner_fns.adam, learn, model.state_dict(), n_learners=2,
                           num_cpus=0, resources={"learner": 1}, start_timeout=120, **kw)


@pytest.mark.timeout(300)
def test_two_ray_ranks_on_half_rows_equal_one_learner_on_all(cluster):
    torch.manual_seed(0)
    model, batch = toy_model(), toy_batch()
    reference = toy_model()
    reference.load_state_dict(model.state_dict())
    optimizer = learner_fns.adam(reference.parameters())
    with _group(learner_fns.toy_learn, model) as group:
        for _ in range(2):
            metrics = group.learn(batch)
            learner_fns.toy_reference(reference, batch, optimizer=optimizer)
        weights = group.state_dict()
        assert metrics["rows"] == 32 and metrics["n_allreduce"] == learner_fns.N_STEPS
    for k, v in reference.state_dict().items():
        torch.testing.assert_close(weights[k], v, rtol=0, atol=1e-5)
    assert _alive_ranks() == []


@pytest.mark.timeout(300)
def test_learner_ranks_and_a_rollout_batcher_share_the_cluster(cluster):
    from support.agents import DeterministicAgent
    from support.batcher_helpers import counter_env

    from rlstruct.batchers.ray.batcher import RayBatcher

    batcher = RayBatcher(4, DeterministicAgent, {"n_actions": 3}, counter_env,
                         {"n_envs": 2, "n_actions": 3}, n_processes=1, num_cpus_per_actor=1,
                         actor_options={"resources": {"rollout": 1}})
    try:
        batcher.reset()
        with _group(learner_fns.toy_learn, toy_model()) as group:
            batcher.execute()
            group.submit(toy_batch())  # the ranks learn while the rollout actor collects
            traj, _ = batcher.get()
            metrics = group.collect()
        assert traj.trajectories.lengths.shape == (2,) and metrics["rows"] == 32
    finally:
        batcher.close()
    assert _alive_ranks() == []


@pytest.mark.timeout(300)
def test_a_ray_rank_that_raises_or_dies_is_named(cluster):
    model, batch = toy_model(), toy_batch()
    with _group(learner_fns.raising_learn, model, timeout=60) as group, \
            pytest.raises(LearnerError, match="rank 1 raised ValueError") as err:
        group.learn(batch)
    assert err.value.rank == 1 and "bad reward scale" in err.value.learner_traceback
    with _group(learner_fns.killed_learn, model, timeout=60) as group:
        group.learn(batch)
        with pytest.raises(LearnerError, match=r"rank 1's actor died") as err:
            group.learn(batch, index=1)
    assert err.value.rank == 1
    assert _alive_ranks() == []


@pytest.mark.timeout(300)
def test_ppo_places_its_learner_ranks_on_ray_from_its_flags(cluster, tmp_path):
    import csv

    import tyro

    from rlstruct.algos import ppo

    cfg = tyro.cli(ppo.Config, args=[
        "--learner-device", "cpu", "--backend", "ray", "--n-processes", "2", "--n-envs", "1",
        "--learner-backend", "ray", "--n-learners", "2", "--learner-num-cpus", "0",
        "--learner-resources", "learner", "1", "--n-timesteps", "16", "--max-frames", "160",
        "--eval-every", "0", "--n-epochs", "1", "--runs-dir", str(tmp_path)])
    summary = ppo.main(cfg)  # Run.learner_group: a RayLearnerGroup beside the RayBatcher
    assert summary["stopped_by"] == "max_frames"
    with open(tmp_path / summary["run_dir"] / "progress.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("n_allreduce") not in (None, "", "nan")]
    assert rows and all(float(r["n_allreduce"]) >= 1 and float(r["allreduce_ms"]) > 0
                        for r in rows)  # two ranks averaged their gradients
    assert _alive_ranks() == []  # closed with the run
    assert ray.is_initialized()  # the fixture's connection: not the group's to shut down

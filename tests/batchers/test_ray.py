"""RayBatcher (issue 12): the Batcher API on Ray actors, bitwise equal to Batcher, typed failures,
restarts within a budget, a node lost from a two-node cluster.

The whole module is skipped without Ray (``pip install -e '.[ray]'``). Its tests share ONE Ray
cluster (the ``cluster`` fixture: a ``ray.cluster_utils.Cluster`` with a 2-CPU head node bound to
the loopback address), started at the module's first test that needs it and shut down after
its last: no test module after this one ever sees Ray's daemons. Ray's daemons (GCS, raylet,
idle workers) are descendants of the pytest process by design, so this module replaces the
autouse ``no_leftover_processes`` check of conftest.py with its own: no non-Ray process may be
left behind, and no RayBatcher actor may be left alive.

Faults follow the fixed schedule of :mod:`rlstruct.envs.faults`: with run seed ``s``, global env
``g`` has seed ``s * 2**20 + g``; with 2 workers of 4 envs, global env 7 is env 3 of worker 1.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import gc
import json
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from support.agents import DeterministicAgent, RecurrentAgent
from support.batcher_helpers import counter_env
from support.fault_envs import (
    assert_counter_rows_are_valid,
    broken_worker_env,
    flaky_counter_env,
)
from support.processes import reap_non_ray_children
from torch import nn

from rlstruct.agent import Agent
from rlstruct.batchers import Batcher
from rlstruct.batchers.restart import RESTART_SEED_STRIDE, RestartPolicy
from rlstruct.batchers.seeding import SEED_BLOCK
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.faults import faulty_gym_env
from rlstruct.envs.gym import GymEnvInf
from rlstruct.errors import (
    BatcherStateError,
    ConfigError,
    KeyMismatchError,
    WorkerError,
    WorkerTimeoutError,
)

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")

from ray.cluster_utils import Cluster  # noqa: E402  (after the skip)

from rlstruct.batchers import RayBatcher  # noqa: E402

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
RUN_SEED = 2
N_ENVS = 4
#: The environment of Ray's local-only mode (every Ray process binds to 127.0.0.1), usage
#: statistics off.
LOCAL_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: A node lost is declared dead after about 3 s instead of Ray's default 30 s or so.
FAST_HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}


# ------------------------------------------------------------------------------ agents, envs
class GlobalRNGAgent(Agent):
    """CartPole policy as users write it: an unseeded MLP built in create_agent, actions sampled
    from torch's global generator, noise from numpy's and Python's."""

    def __init__(self) -> None:
        self.model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))

    def __call__(self, state, observation, agent_info):
        logits = self.model(observation["frame"])
        action = torch.distributions.Categorical(logits=logits).sample()
        n = action.shape[0]
        noise = torch.tensor(np.random.rand(n), dtype=torch.float32)
        coin = torch.tensor([random.random() for _ in range(n)], dtype=torch.float32)
        weights = sum(float(p.sum()) for p in self.model.parameters())
        out = {
            "action": action,
            "noise": noise,
            "coin": coin,
            "weights": torch.full((n,), weights, dtype=torch.float64),
        }
        return DictTensor(out), state


class WeightAgent(Agent):
    """Alternating actions; reports its model's first weight and a scale set by a non-tensor
    update, to see which update ran where."""

    def __init__(self) -> None:
        self.model = nn.Linear(1, 1)
        self.scale = 1.0

    def update(self, info):
        if "scale" in info:
            self.scale = float(info["scale"])
        else:
            super().update(info)

    def __call__(self, state, observation, agent_info):
        n = observation["reward"].shape[0]
        action = observation["env_step"] % 2
        w = self.model.weight[0, 0].expand(n)
        return DictTensor({"action": action, "w": w, "scale": torch.full((n,), self.scale)}), state


class SlowAgent(Agent):
    """Alternating actions after a pause (for non-blocking gets)."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds

    def __call__(self, state, observation, agent_info):
        time.sleep(self.seconds)
        return DictTensor({"action": observation["env_step"] % 2}), state


def cartpole(n_envs: int, seed: int) -> GymEnvInf:
    return GymEnvInf("CartPole-v1", n_envs=n_envs, seed=seed)


def cartpole_vector_env(mode: str, num_envs: int) -> gym.vector.SyncVectorEnv:
    """A user's vector env factory (defined here: Ray actors import this module, not support)."""
    make = functools.partial(gym.make, "CartPole-v1", max_episode_steps=12)
    return gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=mode)


def episode_length(env_id: int, episode: int) -> int:
    return 2 + (env_id + episode) % 4




def faulty(cls, fault: str, worker: int, env: int, at_step: int, **kw):
    env_args = {
        "env_id": "CartPole-v1",
        "n_envs": N_ENVS,
        "fault": fault,
        "auto_reset": True,
        "fault_seed": RUN_SEED * SEED_BLOCK + worker * N_ENVS + env,
        "at_step": at_step,
        **kw.pop("env_args", {}),
    }
    agent = kw.pop("agent", WeightAgent)
    return cls(10, agent, {}, faulty_gym_env, env_args, n_processes=2, seeds=RUN_SEED, **kw)


def weights(value: float) -> dict[str, torch.Tensor]:
    return {"weight": torch.full((1, 1), value), "bias": torch.zeros(1)}


def assert_same(a, b) -> None:
    """Bitwise equal batches: keys, lengths, info and every step tensor (padding included)."""
    assert a.trajectories.lengths.tolist() == b.trajectories.lengths.tolist()
    for x, y in ((a.info, b.info), (a.trajectories, b.trajectories)):
        assert sorted(x.keys()) == sorted(y.keys())
        for k in x:
            assert torch.equal(x[k], y[k]), k


# ------------------------------------------------------------------------------ fixtures
@contextlib.contextmanager
def local_only_ray():
    """Ray's local-only mode for the processes started inside (loopback only, no usage
    statistics), and for this process's own Ray calls."""
    from ray._private import ray_constants

    saved_env = {k: os.environ.get(k) for k in LOCAL_ENV}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ.update(LOCAL_ENV)
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def cluster():
    """The one Ray cluster of these tests: a head node with 2 CPUs on 127.0.0.1, this process
    connected to it (so every RayBatcher here runs on an existing cluster, which it must never
    shut down). Module-scoped: it is gone before the next test module runs."""
    with local_only_ray():
        c = Cluster(
            initialize_head=True,
            connect=True,
            head_node_args={
                "num_cpus": 2,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
                "_system_config": FAST_HEALTH_CHECKS,
            },
        )
        try:
            yield c
        finally:
            ray.shutdown()
            c.shutdown()


def _alive_actors() -> list[str]:
    """RayBatcher actors the cluster still holds alive (any state but DEAD)."""
    if not ray.is_initialized():
        return []
    from ray._private import state

    return [
        f"{a['ActorID'][:8]} ({a['State']})"
        for a in state.actors().values()
        if a.get("ActorClassName") == "RayBatcherWorker" and a.get("State") != "DEAD"
    ]


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Replaces conftest.py's check for this module: Ray's daemons and idle workers stay (the
    cluster fixture owns them), but no other process may be left behind, and every RayBatcher
    actor of the test must be dead."""
    yield
    actors = reap_non_ray_children(_alive_actors)
    assert not actors, f"the test left RayBatcher actors alive: {actors}"


# ------------------------------------------------------------------------------ no Ray
def test_without_ray_the_import_error_says_how_to_install(monkeypatch):
    import rlstruct.batchers as batchers

    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` sees when it is missing
    with pytest.raises(ImportError, match=r"pip install -e '\.\[ray\]'"):
        batchers.RayBatcher  # noqa: B018
    with pytest.raises(ImportError, match=r"pip install -e '\.\[ray\]'"):
        exec("from rlstruct.batchers import RayBatcher", {})
    # A fresh import of the backend module itself works (doctest collection, API docs) and its
    # constructor says the same.
    names = ("rlstruct.parallel.ray_cluster", "rlstruct.batchers.ray.batcher")
    saved = {name: sys.modules.pop(name) for name in names}
    packages = (sys.modules["rlstruct.parallel"], sys.modules["rlstruct.batchers.ray"])
    for package, name in zip(packages, ("ray_cluster", "batcher")):  # undone after the test
        monkeypatch.setattr(package, name, saved[f"{package.__name__}.{name}"])
    try:
        import rlstruct.batchers.ray.batcher as fresh

        assert fresh.ray is None
        with pytest.raises(ImportError, match=r"pip install -e '\.\[ray\]'"):
            fresh.RayBatcher(2, DeterministicAgent, {}, counter_env, {"n_envs": 2})
    finally:
        sys.modules.update(saved)


def test_nothing_else_in_rlstruct_imports_ray():
    backend = REPO / "rlstruct" / "parallel" / "ray_cluster.py"
    importers = []
    for path in sorted((REPO / "rlstruct").rglob("*.py")):
        if path == backend:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if any(n == "ray" or n.startswith("ray.") for n in names):
                importers.append(str(path.relative_to(REPO)))
    assert not importers
    code = "import sys, rlstruct, rlstruct.batchers, rlstruct.envs; print('ray' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"pipeline": 0}, "pipeline must be an int >= 1"),
        ({"num_cpus_per_actor": -1}, "num_cpus_per_actor must be a number >= 0"),
        ({"num_gpus_per_actor": 1.5}, "above 1, Ray wants a whole number"),
        ({"device": "cuda"}, "needs num_gpus_per_actor > 0"),
        ({"actor_options": {"num_cpus": 2}}, r"must not set \['num_cpus'\]"),
        ({"n_processes": 0}, "n_processes must be a positive int"),
        ({"timeout": 0}, "timeouts must be > 0"),
    ],
)
def test_bad_arguments_raise_before_anything_starts(kw, message):
    start = time.monotonic()
    with pytest.raises(ConfigError, match=message):
        RayBatcher(2, DeterministicAgent, {}, counter_env, {"n_envs": 2}, **kw)
    assert time.monotonic() - start < 1.0  # no cluster, no actor


# ------------------------------------------------------------------------------ same data
def counter_batchers(cls, agent, auto_reset: bool):
    env_args = {"n_envs": 2, "episode_length": episode_length, "n_actions": 3}
    env_args["auto_reset"] = auto_reset
    return cls(3, agent, {"n_actions": 3}, counter_env, env_args, n_processes=2, seeds=3)


@pytest.mark.parametrize(
    ("agent", "auto_reset"), [(DeterministicAgent, False), (RecurrentAgent, True)]
)
def test_equals_batcher_bitwise_on_counter_envs(cluster, agent, auto_reset):
    """Full episodes (rows end at different steps: the padding is compared too) and endless
    segments with a recurrent agent (its state at segment start travels in the info)."""
    r = counter_batchers(RayBatcher, agent, auto_reset)
    with r, counter_batchers(Batcher, agent, auto_reset) as b:
        assert r.n_elems() == b.n_elems() == 4
        r.reset()
        b.reset()
        assert r.n_running == b.n_running == 4
        for _ in range(4):
            if b.n_running == 0:
                break
            r.execute()
            b.execute()
            (x, nx), (y, ny) = r.get(), b.get()
            assert nx == ny
            assert_same(x, y)
    # The cluster is the caller's: closing the batcher left it running.
    assert ray.is_initialized()
    assert ray.get(ray.put(7), timeout=30) == 7


def test_equals_batcher_bitwise_for_an_agent_sampling_from_global_generators(cluster):
    """Same RNG rule as Batcher workers: build seed, then each actor's own agent seed; an update
    in between goes through the object store."""
    make = {"n_processes": 2, "seeds": 3}
    ray_b = RayBatcher(8, GlobalRNGAgent, {}, cartpole, {"n_envs": 2}, **make)
    batcher = Batcher(8, GlobalRNGAgent, {}, cartpole, {"n_envs": 2}, **make)
    new = GlobalRNGAgent().model.state_dict()
    with ray_b, batcher:
        ray_b.reset()
        batcher.reset()
        for i in range(3):
            if i == 2:
                ray_b.update(new)
                batcher.update(new)
            ray_b.execute()
            batcher.execute()
            (x, nx), (y, ny) = ray_b.get(), batcher.get()
            assert nx == ny
            assert_same(x, y)
        assert x.info["policy_version"].tolist() == [1] * 4
        w = x.trajectories["action/weights"]
        assert torch.equal(w, torch.full_like(w, float(w[0, 0])))  # the same model everywhere
        noise = x.trajectories["action/noise"]
        assert not torch.equal(noise[:2], noise[2:])  # each actor samples its own stream


def test_a_gymnasium_vector_env_equals_batchers_bitwise(cluster):
    """VectorEnvAdapter as create_env: each actor builds its own vector env from the factory;
    the batches are the Batcher's, bit for bit (SAME_STEP and NEXT_STEP)."""
    from rlstruct.envs.vector import VectorEnvAdapter

    for mode in ("SameStep", "NextStep"):
        args = {"make_env": functools.partial(cartpole_vector_env, mode), "n_envs": 2}
        make = {"n_processes": 2, "seeds": 3}
        with RayBatcher(20, GlobalRNGAgent, {}, VectorEnvAdapter, args, **make) as ray_b, \
                Batcher(20, GlobalRNGAgent, {}, VectorEnvAdapter, args, **make) as batcher:
            ray_b.reset()
            batcher.reset()
            ray_b.execute()
            batcher.execute()
            (x, nx), (y, ny) = ray_b.get(), batcher.get()
            assert nx == ny
            assert_same(x, y)
            assert x.trajectories["_observation/done"].any()


def test_equals_batcher_bitwise_on_a_dict_observation_with_a_multi_input_model(cluster):
    """A Dict env (a uint8 image and a float vector) and a multi-input model: the Ray batcher's
    trajectories are Batcher's, each key in its own dtype (issue 42, item 2)."""
    from rlstruct.blocks.distributions import space_spec
    from rlstruct.blocks.multi_input import feature_size, model_factory, obs_spec
    from rlstruct.blocks.sampling import PolicyAgent
    from rlstruct.blocks.zoo import actor_critic
    from rlstruct.envs.debug import DICT_ID, DictEnv

    env = DictEnv()
    spec = obs_spec(env.observation_space)
    torch.manual_seed(0)
    model = model_factory(spec, actor_critic, "mlp", (feature_size(spec),),
                          space_spec(env.action_space), 16)()
    args = (5, PolicyAgent, {"model": model}, GymEnvInf, {"env": DICT_ID, "n_envs": 2})
    with RayBatcher(*args, n_processes=2, seeds=4) as r, \
            Batcher(*args, n_processes=2, seeds=4) as b:
        r.reset()
        b.reset()
        r.execute()
        b.execute()
        (x, nx), (y, ny) = r.get(), b.get()
        assert nx == ny
        assert_same(x, y)
    assert x.trajectories["observation/image"].dtype == torch.uint8
    assert x.trajectories["observation/vector"].dtype == torch.float32


def test_get_on_a_device_is_the_batchers_get(cluster):
    """get(device=...) as Batcher's: the same batch, on that device (``meta`` stands in for a
    GPU: the batch lands there)."""
    r = counter_batchers(RayBatcher, DeterministicAgent, True)
    with r, counter_batchers(Batcher, DeterministicAgent, True) as b:
        assert r.pipeline == b.pipeline == 1
        r.reset()
        b.reset()
        r.execute()
        b.execute()
        (x, nx), (y, ny) = r.get(device="cpu"), b.get(device="cpu")
        assert nx == ny
        assert_same(x, y)
        r.execute()
        batch, _ = r.get(device="meta")
        assert batch.trajectories.device().type == "meta"


@pytest.mark.parametrize("pipeline", [2, 3])
def test_pipelined_collection_equals_batchers_bitwise(cluster, pipeline):
    """Issue 18: pipelining on Ray. Segment j + K starts at the update (or get) after segment j
    was returned, with the newest weights, on Ray as on worker processes: the same data, the
    same policy versions; reset() drains the stream."""
    make = {"n_processes": 2, "seeds": 3, "pipeline": pipeline}
    ray_b = RayBatcher(6, GlobalRNGAgent, {}, cartpole, {"n_envs": 2}, **make)
    batcher = Batcher(6, GlobalRNGAgent, {}, cartpole, {"n_envs": 2}, **make)
    model = GlobalRNGAgent().model
    with ray_b, batcher:
        assert ray_b.pipeline == batcher.pipeline == pipeline
        for _round in range(2):
            ray_b.reset()
            batcher.reset()
            ray_b.execute()
            batcher.execute()
            for i in range(4):
                (x, nx), (y, ny) = ray_b.get(), batcher.get()
                assert nx == ny
                assert_same(x, y)
                with torch.no_grad():
                    model[0].weight.add_(0.1 * (i + 1))
                sd = model.state_dict()
                ray_b.update(sd)
                batcher.update(sd)
        versions = x.info["policy_version"].tolist()
        assert versions == y.info["policy_version"].tolist() and versions[0] >= 4


# ------------------------------------------------------------------------------ API
def test_update_is_one_put_and_every_batch_carries_its_policy_version(cluster, monkeypatch):
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(value) or real_put(value, **kw))
    with RayBatcher(4, WeightAgent, {}, cartpole, {"n_envs": 2}, n_processes=2) as b:
        b.update(weights(0.5))  # before reset: loaded at the first call
        assert len(puts) == 1 and isinstance(puts[0]["weight"], np.ndarray)
        b.reset()
        b.execute()
        b.update(weights(1.5))  # while the segment runs: applies from the next one
        b.update(weights(2.5))
        first, _ = b.get()
        assert len(puts) == 3  # one per update, for two actors
        assert torch.all(first.trajectories["action/w"] == 0.5)
        assert first.info["policy_version"].tolist() == [1] * 4
        b.execute()
        second, _ = b.get()
        assert torch.all(second.trajectories["action/w"] == 2.5)
        assert second.info["policy_version"].tolist() == [3] * 4
        b.update({"scale": 3.0})  # not a state_dict: serialised once, applied in order
        assert len(puts) == 4 and isinstance(puts[3], bytes)
        b.execute()
        third, _ = b.get()
        assert torch.all(third.trajectories["action/scale"] == 3.0)
        assert torch.all(third.trajectories["action/w"] == 2.5)
        assert third.info["policy_version"].tolist() == [4] * 4 and b.version == 4
        with pytest.raises(KeyMismatchError, match="missing"):
            b.update({"weight": torch.zeros(1, 1)})


def test_non_blocking_get_and_the_call_order(cluster):
    with RayBatcher(5, SlowAgent, {}, cartpole, {"n_envs": 2}, n_processes=2) as b:
        with pytest.raises(BatcherStateError, match="call reset"):
            b.execute()
        b.reset()
        with pytest.raises(BatcherStateError, match="execute"):
            b.get()
        b.execute()
        with pytest.raises(BatcherStateError, match="in flight"):
            b.execute()
        with pytest.raises(BatcherStateError):
            b.reset()
        assert b.get(blocking=False) == (None, None)
        deadline = time.monotonic() + 30
        while (got := b.get(blocking=False))[0] is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        batch, n_running = got
        assert batch.n_elems() == 4 and n_running == 4
        assert batch.info["env_id"].tolist() == [0, 1, 2, 3]
    with pytest.raises(BatcherStateError, match="closed"):
        b.reset()


def test_a_batcher_dropped_without_close_kills_its_actors(cluster):
    b = RayBatcher(3, DeterministicAgent, {"n_actions": 2}, counter_env, {"n_envs": 2})
    b.reset()
    del b
    gc.collect()  # the finalizer kills the actors; the fixture checks that none is left
    assert ray.is_initialized()  # and the caller's cluster is still there


# ------------------------------------------------------------------------------ failures
def test_an_env_exception_names_worker_env_step(cluster):
    b = faulty(RayBatcher, "raise", worker=1, env=3, at_step=7)
    b.reset()
    b.execute()
    with pytest.raises(WorkerError) as info:
        b.get()
    err = info.value
    assert (err.worker, err.env, err.step, err.exc_type) == (1, 7, 7, "InjectedFaultError")
    assert "worker 1, env 7, step 7 during env step: InjectedFaultError" in str(err)
    assert "faults.py" in err.remote_traceback
    with pytest.raises(BatcherStateError, match="failed earlier"):
        b.execute()
    start = time.monotonic()
    b.close()
    b.close()
    assert time.monotonic() - start < 5.0


def test_a_failing_env_factory_raises_from_the_constructor(cluster):
    with pytest.raises(WorkerError, match="worker 1 during env factory: InjectedFaultError") as e:
        faulty(RayBatcher, "raise", worker=1, env=0, at_step=0, env_args={"factory_fails": True})
    assert e.value.worker == 1


@pytest.mark.parametrize("fault", ["kill", "exit"])
def test_a_dead_actor_is_a_worker_error_naming_it(cluster, fault):
    with faulty(RayBatcher, fault, worker=0, env=1, at_step=3) as b:
        b.reset()
        b.execute()
        start = time.monotonic()
        with pytest.raises(WorkerError, match="worker 0 died during execute") as info:
            b.get()
        assert time.monotonic() - start < 30
        assert info.value.worker == 0 and info.value.exc_type is None


def test_a_hung_actor_times_out_and_close_is_bounded(cluster):
    b = faulty(RayBatcher, "hang", worker=1, env=2, at_step=2, timeout=2.0)
    b.reset()
    b.execute()
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match=r"workers \[1\]") as info:
        b.get()
    assert time.monotonic() - start < 2.0 + 2.0
    assert info.value.worker == 1
    start = time.monotonic()
    b.close()
    assert time.monotonic() - start < 5.0


# ------------------------------------------------------------------------------ restarts
@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_a_fault_costs_one_restart_and_the_next_batch_is_complete(cluster, fault):
    with faulty(
        RayBatcher, fault, worker=1, env=3, at_step=7, restart=RestartPolicy(max_restarts=2)
    ) as b:
        b.reset()
        b.update(weights(0.5))
        b.execute()
        spoiled, n_running = b.get()
        # Worker 1's rows are left out: they would stop at step 7 with a half-stepped env.
        assert spoiled.info["env_id"].tolist() == [0, 1, 2, 3] and n_running == 8
        assert len(b.faults) == 1
        record = b.faults[0]
        assert (record.worker, record.segment, record.restart) == (1, 0, 1)
        if fault == "raise":
            assert (record.env, record.step, record.exc_type) == (7, 7, "InjectedFaultError")
        else:
            assert record.exc_type is None and "died" in record.message
        b.update(weights(1.5))
        b.execute()
        batch, n_running = b.get()
        assert batch.info["env_id"].tolist() == list(range(8)) and n_running == 8
        assert batch.trajectories.lengths.tolist() == [10] * 8
        # The replacement reset its envs (fresh seeds) and runs the newest weights.
        assert batch.trajectories["observation/env_step"][4:, 0].tolist() == [0] * 4
        assert torch.all(batch.trajectories["action/w"] == 1.5)
        assert batch.info["policy_version"].tolist() == [2] * 8


def dies_in_its_first_replacement(n_envs: int, seed: int, **kw):
    """faulty_gym_env, except that the first replacement of a worker dies while it starts (its
    actor is gone, as when Ray places it on a node that is being lost)."""
    if seed // RESTART_SEED_STRIDE == 1:
        os._exit(3)
    return faulty_gym_env(n_envs=n_envs, seed=seed, **kw)


def test_a_replacement_lost_while_starting_costs_one_more_restart(cluster):
    """Issue 18: a node lost during a batch used to end the run with "worker 3 died during
    restart" although restarts remained. A replacement whose actor dies while starting now costs
    one restart and is replaced in turn."""
    env_args = {
        "env_id": "CartPole-v1",
        "n_envs": N_ENVS,
        "fault": "kill",
        "auto_reset": True,
        "fault_seed": RUN_SEED * SEED_BLOCK + 1 * N_ENVS + 3,
        "at_step": 7,
    }
    policy = RestartPolicy(max_restarts=3)
    with RayBatcher(
        10, WeightAgent, {}, dies_in_its_first_replacement, env_args, n_processes=2,
        seeds=RUN_SEED, restart=policy,
    ) as b:  # fmt: skip
        b.reset()
        b.execute()
        spoiled, _ = b.get()
        assert spoiled.info["env_id"].tolist() == [0, 1, 2, 3]
        assert [(f.worker, f.restart) for f in b.faults] == [(1, 1), (1, 2)]
        assert "died during restart" in b.faults[1].message
        b.execute()
        batch, _ = b.get()
        assert batch.info["env_id"].tolist() == list(range(8))


def test_a_broken_env_exhausts_exactly_max_restarts_then_raises(cluster):
    with RayBatcher(
        5,
        WeightAgent,
        {},
        broken_worker_env,
        {"n_envs": 2},
        n_processes=2,
        seeds=RUN_SEED,
        restart=RestartPolicy(max_restarts=2),
    ) as b:
        b.reset()
        with pytest.raises(WorkerError, match=r"2 restart\(s\) so far.*max_restarts=2") as info:
            for _ in range(10):
                b.execute()
                b.get()
        assert [f.restart for f in b.faults] == [1, 2] and {f.worker for f in b.faults} == {1}
        assert "this env is broken for good" in str(info.value)
        assert info.value.worker == 1 and info.value.exc_type == "RuntimeError"


def test_max_consecutive_stops_a_fault_loop_early(cluster):
    policy = RestartPolicy(max_restarts=100, max_consecutive=1)
    with RayBatcher(
        5,
        WeightAgent,
        {},
        broken_worker_env,
        {"n_envs": 2},
        n_processes=2,
        seeds=RUN_SEED,
        restart=policy,
    ) as b:
        b.reset()
        with pytest.raises(WorkerError, match=r"1 faults in a row \(max_consecutive=1\)"):
            for _ in range(10):
                b.execute()
                b.get()
        assert len(b.faults) == 1


def test_random_step_failures_corrupt_no_row(cluster):
    """1 % of the steps fail at random: a few restarts over 50 batches of 2 x 4 steps (each
    restart costs an actor's start), and every row handed over holds consecutive steps of one
    counter env."""
    n_batches = 50
    with RayBatcher(
        4,
        WeightAgent,
        {},
        flaky_counter_env,
        {"n_envs": 1, "p": 0.01},
        n_processes=2,
        seeds=RUN_SEED,
        restart=RestartPolicy(max_restarts=1000),
    ) as b:
        b.reset()
        rows = 0
        for _ in range(n_batches):
            b.execute()
            batch, n_running = b.get()
            assert n_running == 2
            if batch.n_elems():
                assert_counter_rows_are_valid(batch)
            rows += batch.n_elems()
        assert 0 < len(b.faults) < 20
        assert all(f.exc_type == "RuntimeError" and f.step is not None for f in b.faults)
        assert rows == n_batches * 2 - len(b.faults)  # exactly the faulty actors' rows


def test_every_actor_reports_its_cpu_time_and_the_monitor_counts_it(cluster, monkeypatch):
    """Issue 18: under Ray the monitor saw only the driver. Each actor now reports its process
    CPU time with every segment; actors outside the driver's process tree (here: made to look
    remote) are added to the monitor's workers."""
    import rlstruct.batchers.pool as pool
    from rlstruct.runs.monitor import ResourceMonitor

    monkeypatch.setattr(pool.socket, "gethostname", lambda: "another-machine")
    monitor = ResourceMonitor(gpu=False)
    with RayBatcher(16, GlobalRNGAgent, {}, cartpole, {"n_envs": 4}, n_processes=2) as b:
        monitor.watch(b)
        assert b.worker_cpu_seconds == 0.0
        b.reset()
        for _ in range(4):
            b.execute()
            b.get()
        used = b.worker_cpu_seconds
        assert used > 0
        assert b.external_cpu_seconds() == pytest.approx(used)
        row = monitor.sample()
    assert row["cores_workers"] > 0
    assert b.external_cpu_seconds() == pytest.approx(used)  # kept after close


# ------------------------------------------------------------------------------ two nodes
@pytest.mark.slow
@pytest.mark.parametrize("restart", [True, False], ids=["restarts", "fail-fast"])
def test_a_lost_node(cluster, restart):
    """Two nodes on this machine: one actor on each (SPREAD); the second node is removed
    between two batches. With restarts its actor comes back on the head node and collection
    goes on; without, the next get raises a WorkerError naming the actor."""
    node = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    policy = RestartPolicy(max_restarts=2) if restart else None
    b = None
    try:
        cluster.wait_for_nodes()
        head = cluster.head_node.node_id
        b = RayBatcher(
            5,
            WeightAgent,
            {},
            cartpole,
            {"n_envs": 2},
            n_processes=2,
            seeds=RUN_SEED,
            restart=policy,
            actor_options={"scheduling_strategy": "SPREAD"},
        )
        assert set(b.nodes) == {head, node.node_id}
        lost = b.nodes.index(node.node_id)
        b.reset()
        b.execute()
        assert b.get()[0].n_elems() == 4
        lost_id = node.node_id
        cluster.remove_node(node, allow_graceful=False)
        node = None
        # A machine lost: wait until Ray declares the node dead (its processes are gone then).
        deadline = time.monotonic() + 60
        while any(n["NodeID"] == lost_id and n["Alive"] for n in ray.nodes()):
            assert time.monotonic() < deadline, "the removed node is still alive"
            time.sleep(0.2)
        b.execute()
        if not restart:
            with pytest.raises(WorkerError, match=f"worker {lost} died during execute") as info:
                b.get()
            assert info.value.worker == lost
            return
        batch, n_running = b.get()
        kept = [0, 1] if lost == 1 else [2, 3]
        assert batch.info["env_id"].tolist() == kept and n_running == 4
        assert [f.worker for f in b.faults] == [lost]
        assert b.nodes == [head, head]
        for _ in range(2):
            b.execute()
            batch, _ = b.get()
            assert batch.info["env_id"].tolist() == [0, 1, 2, 3]
    finally:
        if b is not None:
            b.close()
        if node is not None:
            cluster.remove_node(node)


@pytest.mark.slow
def test_a_node_lost_during_a_batch_costs_restarts_and_never_ends_the_run(cluster):
    """The other order (issue 18): the node is killed while a batch is being collected, and
    the batcher goes on at once, before Ray declares the node dead. Every loss (the actor of
    the batch, and any replacement placed on the dying node) costs one restart, and the run
    goes on while the budget lasts."""
    node = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    policy = RestartPolicy(max_restarts=4)
    b = None
    try:
        cluster.wait_for_nodes()
        head = cluster.head_node.node_id
        b = RayBatcher(
            10,
            SlowAgent,
            {"seconds": 0.05},
            cartpole,
            {"n_envs": 2},
            n_processes=2,
            seeds=RUN_SEED,
            restart=policy,
            actor_options={"scheduling_strategy": "SPREAD"},
        )
        lost = b.nodes.index(node.node_id)
        b.reset()
        b.execute()
        # During the batch, SIGKILL the node's raylet only (a machine that froze or lost its
        # network): its actor dies, and Ray declares the node dead only seconds later.
        from ray._private import ray_constants

        (raylet,) = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET]
        raylet.process.kill()
        b.get()  # no wait for Ray to declare the node dead
        for _ in range(8):  # the actor dies when Ray notices; collection goes on meanwhile
            b.execute()
            batch, _ = b.get()
            if b.faults and batch.info["env_id"].tolist() == [0, 1, 2, 3]:
                break
        assert batch.info["env_id"].tolist() == [0, 1, 2, 3]
        assert 0 < len(b.faults) <= policy.max_restarts
        assert {f.worker for f in b.faults} == {lost}
        assert [f.restart for f in b.faults] == list(range(1, len(b.faults) + 1))
        assert b.nodes == [head, head]
    finally:
        if b is not None:
            b.close()
        with contextlib.suppress(Exception):
            cluster.remove_node(node, allow_graceful=False)


# ------------------------------------------------------------------------------ local cluster
LOCAL_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import psutil
    sys.path.insert(0, {tests!r})
    import conftest  # sends the test helpers to the actors by value, as in the test session
    from support.agents import DeterministicAgent
    from support.batcher_helpers import counter_env
    from rlstruct.batchers import RayBatcher

    if __name__ == "__main__":
        me = psutil.Process()
        b = RayBatcher(3, DeterministicAgent, {{"n_actions": 2}}, counter_env, {{"n_envs": 2}},
                       n_processes=2)
        import ray
        assert ray.is_initialized()
        nodes = ray.nodes()
        assert [n["NodeManagerAddress"] for n in nodes] == ["127.0.0.1"], nodes
        listening = set()
        for proc in [me, *me.children(recursive=True)]:
            try:
                for c in proc.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN:
                        listening.add(c.laddr.ip)
            except psutil.Error:
                pass
        assert listening and listening <= {{"127.0.0.1", "::ffff:127.0.0.1", "::1"}}, listening
        assert not ray._private.worker._global_node.webui_url  # no dashboard
        raylet = [p for p in me.children(recursive=True) if p.name() == "raylet"]
        assert raylet and raylet[0].environ().get("RAY_USAGE_STATS_ENABLED") == "0"
        assert "RAY_USAGE_STATS_ENABLED" not in os.environ  # set for Ray's processes only
        b.reset()
        b.execute()
        assert b.get()[0].n_elems() == 4
        b.close()
        assert not ray.is_initialized()
        _gone, alive = psutil.wait_procs(me.children(recursive=True), timeout=10)
        assert not alive, [" ".join(p.cmdline())[:60] for p in alive]
        # A GPU per actor on a local cluster without GPUs: a ConfigError at once, no waiting
        # for start_timeout, and the cluster it started is shut down again.
        from rlstruct.errors import ConfigError
        try:
            RayBatcher(3, DeterministicAgent, {{"n_actions": 2}}, counter_env, {{"n_envs": 2}},
                       num_gpus_per_actor=1, start_timeout=100)
        except ConfigError as e:
            assert "cannot be placed" in str(e) and "GPU" in str(e), e
        else:
            raise AssertionError("no ConfigError")
        assert not ray.is_initialized()
        print("LOCAL-OK")
    """
)


@pytest.mark.slow
def test_a_local_cluster_it_starts_is_loopback_only_and_shut_down_on_close(tmp_path):
    """Without a cluster, RayBatcher starts one: 127.0.0.1 only, no dashboard, no usage
    statistics; close() shuts it down and no process of it is left; actors it could never place
    are a ConfigError at once (in a fresh process)."""
    script = tmp_path / "local.py"
    script.write_text(LOCAL_SCRIPT.format(tests=str(REPO / "tests")))
    # Neither a cluster address nor the local-only settings of this module's cluster fixture.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and k not in LOCAL_ENV}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "LOCAL-OK" in done.stdout


@pytest.mark.slow
def test_the_benchmark_runs(tmp_path):
    """Smoke run of benchmarks/ray_backend.py --quick (no timing asserted: the figures are the
    benchmark's output)."""
    out = tmp_path / "ray_backend.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and k not in LOCAL_ENV}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "ray_backend.py"),
            "--quick",
            "--json",
            str(out),
        ],
        cwd=REPO / "benchmarks",
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads(out.read_text())
    assert result["startup_s"]["ray_first"] > 0
    assert set(result["throughput"]["steps_per_s"]) == {"batcher", "ray"}
    assert result["update"]["ray"]["call_s"]["n"] == 2
    assert set(result["restart"]) == {"batcher_raise", "ray_raise"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_algorithm_runs_on_the_ray_backend(tmp_path, cluster):
    from rlstruct.algos import ppo
    from rlstruct.runs.layout import LayoutConfig

    cfg = ppo.Config(
        layout=LayoutConfig(learner_device="cpu", n_processes=2, n_envs=2, backend="ray"),
        n_timesteps=16, max_frames=600, eval_every=0, n_epochs=1, runs_dir=str(tmp_path),
    )
    summary = ppo.main(cfg)
    assert summary["frames"] >= 600 and summary["stopped_by"] == "max_frames"

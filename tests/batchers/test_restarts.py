"""Restarts within a budget for ``Batcher`` (issue 12, section 2), on fixed fault schedules."""

from __future__ import annotations

import pytest
import torch
from support.fault_envs import (
    assert_counter_rows_are_valid,
    broken_worker_env,
    flaky_counter_env,
)
from torch import nn

from rlstruct.agent import Agent
from rlstruct.batchers import Batcher
from rlstruct.batchers.restart import RestartPolicy, restart_env_seed
from rlstruct.batchers.seeding import SEED_BLOCK
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.faults import faulty_gym_env
from rlstruct.errors import ConfigError, WorkerError

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

RUN_SEED = 2
N_ENVS = 4


class WeightAgent(Agent):
    """Alternating actions; reports its model's first weight, to see which weights ran."""

    def __init__(self) -> None:
        self.model = nn.Linear(1, 1)

    def __call__(self, state, observation, agent_info):
        n = observation["reward"].shape[0]
        action = observation["env_step"] % 2
        w = self.model.weight[0, 0].expand(n)
        return DictTensor({"action": action, "w": w}), state




def faulty(fault: str, worker: int, env: int, at_step: int, restart: RestartPolicy | None,
           agent=WeightAgent) -> Batcher:
    env_args = {
        "env_id": "CartPole-v1", "n_envs": N_ENVS, "fault": fault, "auto_reset": True,
        "fault_seed": RUN_SEED * SEED_BLOCK + worker * N_ENVS + env, "at_step": at_step,
    }
    return Batcher(10, agent, {}, faulty_gym_env, env_args, n_processes=2, seeds=RUN_SEED,
                   restart=restart)


def weights(value: float) -> dict[str, torch.Tensor]:
    return {"weight": torch.full((1, 1), value), "bias": torch.zeros(1)}


def test_restart_policy_is_validated():
    with pytest.raises(ConfigError, match="max_restarts must be >= 0"):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(ConfigError, match="max_consecutive"):
        RestartPolicy(max_consecutive=0)
    assert restart_env_seed(7, 2) % 2**32 == 7


@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_a_fault_costs_one_restart_and_the_next_batch_is_complete(fault):
    with faulty(fault, worker=1, env=3, at_step=7, restart=RestartPolicy(max_restarts=2)) as b:
        b.reset()
        b.update(weights(0.5))
        b.execute()
        spoiled, _ = b.get()
        # Worker 1's rows are left out: they would stop at step 7 with a half-stepped env.
        assert spoiled.info["env_id"].tolist() == [0, 1, 2, 3]
        assert len(b.faults) == 1
        fault_record = b.faults[0]
        assert (fault_record.worker, fault_record.segment, fault_record.restart) == (1, 0, 1)
        if fault == "raise":
            assert (fault_record.env, fault_record.step) == (7, 7)
            assert fault_record.exc_type == "InjectedFaultError"
        else:
            assert fault_record.exitcode == -9
        b.update(weights(1.5))
        b.execute()
        batch, n_running = b.get()
        assert batch.info["env_id"].tolist() == list(range(8)) and n_running == 8
        assert batch.trajectories.lengths.tolist() == [10] * 8
        # The replacement reset its envs and runs the newest weights.
        assert batch.trajectories["observation/env_step"][4:, 0].tolist() == [0] * 4
        assert torch.all(batch.trajectories["action/w"] == 1.5)
        assert batch.info["policy_version"].tolist() == [2] * 8


def test_a_broken_env_exhausts_exactly_max_restarts_then_raises():
    with Batcher(5, WeightAgent, {}, broken_worker_env, {"n_envs": 2}, n_processes=2,
                 seeds=RUN_SEED, restart=RestartPolicy(max_restarts=3)) as b:
        b.reset()
        with pytest.raises(WorkerError, match=r"3 restart\(s\) so far.*max_restarts=3") as info:
            for _ in range(10):
                b.execute()
                b.get()
        assert len(b.faults) == 3 and [f.restart for f in b.faults] == [1, 2, 3]
        assert all(f.worker == 1 for f in b.faults)
        assert "this env is broken for good" in str(info.value)
        assert info.value.worker == 1 and info.value.exc_type == "RuntimeError"


def test_max_consecutive_stops_a_fault_loop_early():
    policy = RestartPolicy(max_restarts=100, max_consecutive=2)
    with Batcher(5, WeightAgent, {}, broken_worker_env, {"n_envs": 2}, n_processes=2,
                 seeds=RUN_SEED, restart=policy) as b:
        b.reset()
        with pytest.raises(WorkerError, match=r"2 faults in a row \(max_consecutive=2\)"):
            for _ in range(10):
                b.execute()
                b.get()
        assert len(b.faults) == 2


def test_without_a_policy_the_first_fault_raises():
    with faulty("raise", worker=1, env=3, at_step=7, restart=None) as b:
        b.reset()
        b.execute()
        with pytest.raises(WorkerError, match="worker 1, env 7, step 7"):
            b.get()
        assert b.faults == []


def test_one_percent_random_step_failures_corrupt_no_row():
    with Batcher(5, WeightAgent, {}, flaky_counter_env, {"n_envs": 2, "p": 0.01},
                 n_processes=2, seeds=RUN_SEED, restart=RestartPolicy(max_restarts=1000)) as b:
        b.reset()
        rows = 0
        for _ in range(300):
            b.execute()
            batch, _ = b.get()
            if batch.n_elems():
                assert_counter_rows_are_valid(batch)
            rows += batch.n_elems()
        assert 20 < len(b.faults) < 200  # ~6000 steps at 1 %
        assert rows == 300 * 4 - sum(2 for _ in b.faults)  # exactly the faulty workers' rows


def test_restarts_in_pipelined_collection_drop_the_owed_segments_only():
    with Batcher(5, WeightAgent, {}, flaky_counter_env, {"n_envs": 2, "p": 0.02},
                 n_processes=2, seeds=RUN_SEED, pipeline=3,
                 restart=RestartPolicy(max_restarts=1000)) as b:
        b.reset()
        b.execute()
        rows = 0
        for i in range(100):
            batch, _ = b.get()
            if batch.n_elems():
                assert_counter_rows_are_valid(batch)
            rows += batch.n_elems()
            b.update(weights(float(i)))
        assert b.faults and rows < 100 * 4
        owed = [f.segment for f in b.faults]
        assert all(s is not None for s in owed)

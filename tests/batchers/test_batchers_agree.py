"""The three batchers agree on their API (issue 17, section 2): ``get(device=...)`` on each, a
``pipeline`` attribute on each, one pipeline-argument check, ``make_batcher`` typed for all three.

RayBatcher's own run of ``get(device=...)`` is in test_ray.py (it needs the module's cluster).
"""

from __future__ import annotations

import inspect

import cloudpickle
import pytest
import torch
from support import agents, batcher_helpers
from support.agents import DeterministicAgent
from support.batcher_helpers import counter_env

from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.batchers.base import BatcherBase
from rlstruct.batchers.make import make_batcher
from rlstruct.errors import ConfigError

cloudpickle.register_pickle_by_value(agents)
cloudpickle.register_pickle_by_value(batcher_helpers)

pytestmark = pytest.mark.timeout(120)

ENV_ARGS = {"n_envs": 2, "n_actions": 3}


def backends() -> list[type]:
    classes: list[type] = [SerialBatcher, Batcher]
    try:
        from rlstruct.batchers import RayBatcher
    except ImportError:
        return classes
    return [*classes, RayBatcher]


@pytest.mark.parametrize("cls", backends(), ids=lambda c: c.__name__)
def test_get_takes_the_same_arguments_on_every_batcher(cls):
    params = inspect.signature(cls.get).parameters
    assert list(params) == ["self", "blocking", "device"]
    assert params["blocking"].default is True
    assert params["device"].default is None


@pytest.mark.slow
def test_get_on_a_device_returns_the_same_batch_there():
    """Batcher and SerialBatcher, same seeds: get(device=d) is the batch of get(), on d (the
    ``meta`` device stands in for a GPU: the batch lands there, not on the CPU)."""
    args = (3, DeterministicAgent, {"n_actions": 3}, counter_env, ENV_ARGS)
    with SerialBatcher(*args, seeds=3) as s, Batcher(*args, seeds=3) as b:
        for batcher in (s, b):
            assert batcher.pipeline == 1
            batcher.reset()
            batcher.execute()
        on_cpu, n_cpu = s.get(device="cpu")
        on_cpu_too, n_b = b.get(device=torch.device("cpu"))
        assert n_cpu == n_b
        assert sorted(on_cpu.trajectories) == sorted(on_cpu_too.trajectories)
        for k in on_cpu.trajectories:
            assert torch.equal(on_cpu.trajectories[k], on_cpu_too.trajectories[k]), k
        for batcher in (s, b):
            batcher.execute()
            batch, _ = batcher.get(device="meta")
            assert batch.trajectories.device().type == "meta"


def test_pipeline_is_an_attribute_of_every_batcher_and_one_check_refuses_bad_values():
    with SerialBatcher(3, DeterministicAgent, {"n_actions": 3}, counter_env, ENV_ARGS) as s:
        assert s.pipeline == 1
    assert BatcherBase.validate_pipeline(2) == []
    for bad in (0, -1, True, 1.5, "2"):
        (problem,) = BatcherBase.validate_pipeline(bad)
        assert f"got {bad!r}" in problem


def test_make_batcher_refuses_a_bad_pipeline_with_the_batchers_check():
    with pytest.raises(ConfigError, match=r"pipeline must be an int >= 1 .* got 0"):
        make_batcher(
            device="cpu", n_processes=2, n_timesteps=3, create_agent=DeterministicAgent,
            agent_args={"n_actions": 3}, create_env=counter_env, env_args=ENV_ARGS, seeds=0,
            pipeline=0,
        )  # fmt: skip


def test_make_batcher_is_typed_for_what_it_returns():
    returned = inspect.signature(make_batcher).return_annotation
    assert returned == "Batcher | SerialBatcher | RayBatcher"


@pytest.mark.slow
def test_process_workers_report_their_cpu_time_and_are_not_counted_twice():
    """Every worker reports its CPU time with each segment (``worker_cpu_seconds``); process
    workers are in this process's tree, which the monitor measures itself: none of it is
    external."""
    args = (8, DeterministicAgent, {"n_actions": 3}, counter_env, {**ENV_ARGS, "auto_reset": True})
    with Batcher(*args, n_processes=2) as b:
        b.reset()
        for _ in range(3):
            b.execute()
            b.get()
        assert b.worker_cpu_seconds > 0
        assert b.external_cpu_seconds() == 0.0

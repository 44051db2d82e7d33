"""make_batcher picks the batcher a device layout calls for; CheckDevice wraps on request."""

from __future__ import annotations

import pytest
import torch
import tyro
from support import batcher_helpers
from support.agents import DeterministicAgent
from support.batcher_helpers import counter_env

from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.batchers.make import make_batcher
from rlstruct.checks import CheckDevice
from rlstruct.errors import ConfigError, DeviceContractError
from rlstruct.runs.layout import LayoutConfig


def build(device, n_processes, **kw):
    return make_batcher(
        device=device,
        n_processes=n_processes,
        n_timesteps=3,
        create_agent=kw.pop("create_agent", DeterministicAgent),
        agent_args={"n_actions": 2},
        create_env=counter_env,
        env_args={"n_envs": 2, "auto_reset": True},
        seeds=0,
        **kw,
    )


def test_cpu_with_one_process_is_serial_and_with_more_is_multiprocess():
    with build("cpu", 1) as serial:
        assert isinstance(serial, SerialBatcher)
    with build("cpu", 2) as multi:
        assert isinstance(multi, Batcher) and multi.n_elems() == 4


@pytest.mark.timeout(60)
def test_one_process_with_a_pipeline_is_one_worker_that_collects_ahead():
    # --n-processes 1 --pipeline 2: one env in one worker, collecting while the learner learns
    with build("cpu", 1, pipeline=2) as one:
        assert isinstance(one, Batcher) and one.n_elems() == 2 and one.n_processes == 1
        one.reset()
        one.execute()
        traj, _ = one.get()
    assert traj.n_elems() == 2


def test_check_devices_wraps_the_agent():
    with build("cpu", 1, check_devices=True) as b:
        assert isinstance(b.agent, CheckDevice)
        b.reset()
        b.execute()
        traj, _ = b.get()
    assert traj.n_elems() == 2


@pytest.mark.timeout(60)
def test_check_devices_catches_a_planted_wrong_device_before_any_worker_starts():
    # The batcher's probe step (in this process) already runs the checked agent.
    with pytest.raises(DeviceContractError, match=r"action\['action'\] is on meta, expected cpu"):
        build("cpu", 2, check_devices=True, create_agent=batcher_helpers.MetaActionAgent)


def test_unavailable_gpu_is_a_config_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError, match="cuda"):
        build("cuda", 1)


def test_layout_flags_parse():
    cfg = tyro.cli(
        LayoutConfig, args=["--learner-device", "cpu", "--n-processes", "3", "--check-devices"]
    )
    assert (cfg.learner_device, cfg.n_processes, cfg.check_devices) == ("cpu", 3, True)
    assert LayoutConfig().n_processes == 2  # the same B = n_processes * n_envs on any machine

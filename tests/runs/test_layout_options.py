"""The layout flags that reach the batchers (issue 18, section 6): ``--max-restarts`` for both
backends, the Ray actors' CPUs, GPUs and custom resources."""

from __future__ import annotations

import cloudpickle
import pytest
from support import agents, batcher_helpers
from support.agents import DeterministicAgent
from support.batcher_helpers import counter_env

from rlstruct.batchers import Batcher
from rlstruct.batchers.make import make_batcher
from rlstruct.errors import ConfigError
from rlstruct.runs.layout import LayoutConfig

cloudpickle.register_pickle_by_value(agents)
cloudpickle.register_pickle_by_value(batcher_helpers)

pytestmark = pytest.mark.timeout(120)


def batcher(**kw):
    return make_batcher(
        device="cpu", n_processes=2, n_timesteps=3, create_agent=DeterministicAgent,
        agent_args={"n_actions": 3}, create_env=counter_env,
        env_args={"n_envs": 2, "n_actions": 3}, seeds=0, **kw,
    )  # fmt: skip


def test_the_layout_hands_its_restart_budget_and_ray_resources_to_make_batcher():
    layout = LayoutConfig(max_restarts=3, ray_num_cpus=0.5, ray_resources={"rollout": 1.0})
    assert layout.batcher_options() == {
        "max_restarts": 3,
        "ray_actor": {
            "num_cpus_per_actor": 0.5,
            "num_gpus_per_actor": 0.0,
            "resources": {"rollout": 1.0},
        },
    }
    assert LayoutConfig().batcher_options()["max_restarts"] == 0  # fail fast by default


@pytest.mark.slow
def test_max_restarts_reaches_the_process_batcher():
    with batcher(max_restarts=2) as b:
        assert isinstance(b, Batcher)
        assert b.restart is not None and b.restart.max_restarts == 2
    with batcher() as b:
        assert b.restart is None


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_restart_budget_is_a_config_error_before_anything_starts(bad):
    with pytest.raises(ConfigError, match="max_restarts must be an int >= 0"):
        batcher(max_restarts=bad)


def test_ray_actors_get_the_layouts_resources(monkeypatch):
    ray_backend = pytest.importorskip("rlstruct.batchers.ray.batcher")
    if ray_backend.ray is None:
        pytest.skip("Ray is not installed: pip install -e '.[ray]'")
    seen = {}

    def fake(*args, **kw):  # records what make_batcher asks of RayBatcher
        seen.update(kw)
        return "ray batcher"

    monkeypatch.setattr(ray_backend, "RayBatcher", fake)
    layout = LayoutConfig(max_restarts=4, ray_num_gpus=0.25, ray_resources={"rollout": 1.0})
    assert batcher(backend="ray", **layout.batcher_options()) == "ray batcher"
    assert seen["restart"].max_restarts == 4
    assert seen["num_cpus_per_actor"] == 1.0 and seen["num_gpus_per_actor"] == 0.25
    assert seen["actor_options"] == {"resources": {"rollout": 1.0}}

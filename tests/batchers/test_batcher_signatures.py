"""The constructors' signatures as help(), IDEs and the site's API reference (`make docs`) see them.

The worker-pool arguments are declared once (``WorkerPool.__init__``); ``RayBatcher`` adds its
own keyword-only options and ``RL_Batcher`` derives rlstructures' order from ``Batcher``'s. These
tests pin what a user sees, so that the shared declaration cannot silently drop or reorder one.
"""

from __future__ import annotations

import inspect

import pytest

from rlstruct import Batcher, SerialBatcher
from rlstruct.batchers.ray.batcher import RayBatcher
from rlstruct.compat import RL_Batcher

POSITIONAL = [
    "n_timesteps",
    "create_agent",
    "agent_args",
    "create_env",
    "env_args",
    "n_processes",
    "seeds",
    "agent_info",
    "env_info",
    "agent_seeds",
    "device",
]
POOL_OPTIONS = ["n_threads", "timeout", "start_timeout", "pipeline", "restart", "adaptive_timeout",
                "deadline"]
RAY_OPTIONS = ["address", "num_cpus_per_actor", "num_gpus_per_actor", "actor_options"]


def _kinds(cls: type) -> list[tuple[str, str, object]]:
    return [
        (p.name, p.kind.name, p.default) for p in inspect.signature(cls).parameters.values()
    ]


def test_batcher_and_ray_batcher_show_every_argument_in_order() -> None:
    batcher = _kinds(Batcher)
    assert [name for name, _, _ in batcher] == POSITIONAL + POOL_OPTIONS
    assert {kind for _, kind, _ in batcher[:11]} == {"POSITIONAL_OR_KEYWORD"}
    assert {kind for _, kind, _ in batcher[11:]} == {"KEYWORD_ONLY"}
    ray = _kinds(RayBatcher)
    assert ray[: len(batcher)] == batcher  # the same shared part, defaults included
    assert ray[len(batcher) :] == [
        ("address", "KEYWORD_ONLY", None),
        ("num_cpus_per_actor", "KEYWORD_ONLY", 1),
        ("num_gpus_per_actor", "KEYWORD_ONLY", 0),
        ("actor_options", "KEYWORD_ONLY", None),
    ]


def test_serial_batcher_is_keyword_only_after_env_args() -> None:
    serial = _kinds(SerialBatcher)
    assert [n for n, _, _ in serial] == POSITIONAL[:5] + POSITIONAL[6:]
    assert {k for _, k, _ in serial[:5]} == {"POSITIONAL_OR_KEYWORD"}
    assert {k for _, k, _ in serial[5:]} == {"KEYWORD_ONLY"}


def test_rl_batcher_keeps_rlstructures_order_and_required_arguments() -> None:
    params = inspect.signature(RL_Batcher).parameters
    assert list(params) == [*POSITIONAL, "store_agent_state"]
    assert {p.kind.name for p in params.values()} == {"POSITIONAL_OR_KEYWORD"}
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
    assert required == POSITIONAL[:9]
    assert params["store_agent_state"].default is False


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((1, None, {}, None, {}, 1, 0, None), {}, "env_info"),  # no default in rlstructures
        ((1, None, {}, None, {}, 1, 0, None, None), {"bogus": 1}, "bogus"),
        ((1, None, {}, None, {}, 1, 0, None, None, None, "cpu", False, 13), {}, "too many"),
    ],
)
def test_rl_batcher_refuses_a_wrong_call_before_building_anything(
    args: tuple[object, ...], kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(TypeError, match=match):
        RL_Batcher(*args, **kwargs)

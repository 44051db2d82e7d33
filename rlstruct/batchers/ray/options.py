"""The checks of ``RayBatcher``'s own arguments (the cluster, the actors' resources and device),
run before anything is started; the arguments every multi-worker batcher takes are checked by
:class:`~rlstruct.batchers.pool.WorkerPool`.

Nothing here imports Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["check_ray_options", "RESERVED_OPTIONS"]

#: Actor options that RayBatcher sets itself (``num_cpus_per_actor``, ...); refused in
#: ``actor_options``.
RESERVED_OPTIONS = ("num_cpus", "num_gpus", "max_restarts", "max_task_retries", "max_concurrency")


def check_ray_options(
    device: Any, address: Any, num_cpus: Any, num_gpus: Any, actor_options: Any
) -> list[str]:
    """The problems of RayBatcher's own arguments (empty when all are fine).

    Args:
        device: the actors' device.
        address: the cluster's address or None.
        num_cpus: ``num_cpus_per_actor``.
        num_gpus: ``num_gpus_per_actor``.
        actor_options: more ``ray.remote`` options, or None.
    """
    problems = []
    if address is not None and (not isinstance(address, str) or not address):
        problems.append(f"address must be None or a non-empty str, got {address!r}")
    for name, value in (("num_cpus_per_actor", num_cpus), ("num_gpus_per_actor", num_gpus)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            problems.append(f"{name} must be a number >= 0, got {value!r}")
        elif value > 1 and value != int(value):
            problems.append(f"{name}={value}: above 1, Ray wants a whole number")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        problems.append(f"device={device!r} is not a device: {e}")
    else:
        if dev.type not in ("cpu", "cuda"):
            problems.append(f"device={device!r}: RayBatcher actors run on 'cpu' or 'cuda'")
        elif dev.type == "cuda" and not (isinstance(num_gpus, (int, float)) and num_gpus > 0):
            problems.append(
                f"device={device!r} needs num_gpus_per_actor > 0 (Ray then gives each actor "
                "its share of a GPU, as 'cuda')"
            )
        elif dev.type == "cuda" and dev.index not in (None, 0):
            problems.append(
                f"device={device!r}: each actor sees only the GPU(s) Ray assigned it, from "
                "cuda:0 on; pass device='cuda'"
            )
    if actor_options is not None:
        if not isinstance(actor_options, Mapping):
            problems.append(f"actor_options must be a dict, got {type(actor_options).__name__}")
        else:
            reserved = sorted(k for k in actor_options if k in RESERVED_OPTIONS)
            if reserved:
                problems.append(
                    f"actor_options must not set {reserved}: RayBatcher sets them "
                    "(num_cpus_per_actor, num_gpus_per_actor; restarts: restart=RestartPolicy)"
                )
    return problems

"""What :class:`~rlstruct.learners.group.LearnerGroup` checks and picks before any rank starts:
its arguments, the ranks' devices and backend by default, and a free rendezvous port."""

from __future__ import annotations

import socket
from collections.abc import Sequence

import torch

from rlstruct.devices import resolve_device
from rlstruct.errors import ConfigError

__all__ = ["check_group_arguments", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (bind to port 0, read it, release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_group_arguments(
    n_learners: int, n_threads: int, n_slots: int, master_port: int | None,
    devices: Sequence[str | torch.device] | None, backend: str | None,
) -> tuple[list[str], list[torch.device], str]:
    """Checks :class:`~rlstruct.learners.group.LearnerGroup`'s arguments.

    Args:
        n_learners, n_threads, n_slots, master_port, devices, backend: the group's arguments.

    Returns:
        ``(problems, devices, backend)``: every problem found (empty when none), the ranks'
        resolved devices (the default of ``devices=None`` included) and the backend (the
        default of ``backend=None`` picked).
    """
    problems = []
    for name, value, low in (("n_learners", n_learners, 1), ("n_threads", n_threads, 1),
                             ("n_slots", n_slots, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(f"{name} must be an integer >= {low}, got {value!r}")
    if master_port is not None and not (isinstance(master_port, int) and
                                        0 < master_port < 65536):
        problems.append(f"master_port must be a port number in 1..65535, got {master_port!r}")
    resolved: list[torch.device] = []
    if isinstance(n_learners, int) and n_learners >= 1:
        if devices is None:
            gpus = torch.cuda.device_count()
            devices = ([f"cuda:{k}" for k in range(n_learners)] if gpus >= n_learners
                       else ["cpu"] * n_learners)
        if len(devices) != n_learners:
            problems.append(f"devices names {len(devices)} device(s) ({list(devices)}) for "
                            f"n_learners={n_learners}; give one device per rank")
        for k, d in enumerate(devices):
            try:
                resolved.append(resolve_device(d))
            except ConfigError as err:
                problems.append(f"devices[{k}] (rank {k}): {err}")
        kinds = {d.type for d in resolved}
        if kinds - {"cpu", "cuda"}:
            problems.append(f"learner ranks run on cpu or cuda devices, got {sorted(kinds)}")
        cuda = [str(d) for d in resolved if d.type == "cuda"]
        if len(set(cuda)) != len(cuda):
            problems.append(f"two ranks share a GPU ({cuda}): NCCL needs one GPU per rank")
    if backend is None:
        backend = "nccl" if resolved and all(d.type == "cuda" for d in resolved) else "gloo"
    if backend not in ("gloo", "nccl"):
        problems.append(f"backend must be 'gloo', 'nccl' or None, got {backend!r}")
    elif backend == "nccl" and any(d.type != "cuda" for d in resolved):
        problems.append(f"backend 'nccl' needs a CUDA device per rank, got "
                        f"{[str(d) for d in resolved]}")
    return problems, resolved, backend

"""Batchers: collect trajectories with CPU worker processes or in one process on any device.

``RayBatcher`` (the same API on Ray actors, for clusters) is imported on demand, so that
importing rlstruct never imports Ray: ``from rlstruct.batchers import RayBatcher`` needs the
``ray`` extra (``pip install -e '.[ray]'`` in a clone) and raises an ImportError saying so
without it.

The two multi-worker backends share their decisions and their workers: ``pool.WorkerPool``
(argument checks, probe, seeds, restart bookkeeping, worker errors, weights) is the base of
``Batcher`` and ``RayBatcher``, and ``core.WorkerCore`` (build env, agent and rollout, load
weights, collect a segment) is what a worker process serves and what a Ray actor wraps. Each
backend keeps only its transport: start, send, wait, kill.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from rlstruct.batchers.process.batcher import Batcher
from rlstruct.batchers.restart import RestartPolicy
from rlstruct.batchers.serial import SerialBatcher
from rlstruct.errors import install_hint

__all__ = ["Batcher", "RestartPolicy", "SerialBatcher"]

#: What the ImportError says when Ray is missing (the same words as
# rlstruct.batchers.ray.batcher's).
_RAY_HINT = f"RayBatcher needs Ray, an optional extra: {install_hint('ray')}"


def __getattr__(name: str) -> Any:
    """``RayBatcher``, imported at first use (module-level ``__getattr__``, PEP 562)."""
    if name == "RayBatcher":
        # find_spec imports nothing (and says None for a module blocked in sys.modules).
        if importlib.util.find_spec("ray") is None:
            raise ImportError(_RAY_HINT, name="ray")
        from rlstruct.batchers.ray import batcher as backend

        if backend.ray is None:  # installed but broken: say why
            backend.require_ray("RayBatcher")
        return backend.RayBatcher
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Device layouts for experiments: :class:`LayoutConfig`, the flags every algorithm shares.

:class:`LayoutConfig` is a typed dataclass (its fields' docstrings are the ``--help`` text of
the flags); :func:`rlstruct.batchers.make.make_batcher` turns a layout into a batcher (which
batcher each device selects is written there).

The default of ``n_processes`` is 2, not "one per core": with the same seed a run collects the
same data on any machine (``B = n_processes * n_envs`` rows whatever the core count).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from rlstruct.errors import install_hint

__all__ = ["LayoutConfig"]


@dataclass
class LayoutConfig:
    """Where each part of an experiment runs (the same flags for every algorithm)."""

    learner_device: str = "auto"
    """device of the model being trained and of the loss (auto: cuda:0 when there is a GPU)"""
    batcher_device: str = "cpu"
    """device of the training batcher: cpu (worker processes) or a GPU (one process)"""
    eval_device: str = "cpu"
    """device of the evaluation batcher: cpu (a worker process of its own) or a GPU"""
    n_processes: int = 2
    """training worker processes on the CPU (0: one per core; 1: no worker, collect here, or one
    worker with --pipeline 2)"""
    n_envs: int = 8
    """environments per worker process (or in the device batcher)"""
    check_devices: bool = False
    """wrap every agent in CheckDevice (a debugging aid)"""
    pipeline: int = 1
    """segment slots per worker: 1 collects then learns; 2 collects the next batch while learning
    on this one (one update of policy lag; on the CPU batcher only)"""
    backend: Literal["local", "ray"] = "local"
    """training workers: local processes, or Ray actors (the ray extra: pip install -e '.[ray]';
    see docs/guide-clusters.md)"""
    ray_address: str | None = None
    """Ray cluster to join (auto: the one `ray start` set up); None: the configured one, else a
    local cluster on this machine"""
    max_restarts: int = 0
    """worker faults absorbed by replacing the worker, over the whole run (a process or Ray actor
    that dies, a node lost, an env or agent that raises; 0: the first fault ends the run)"""
    ray_num_cpus: float = 1.0
    """CPUs Ray reserves for each actor (--backend ray; fractions allowed)"""
    ray_num_gpus: float = 0.0
    """GPUs Ray reserves for each actor (--backend ray; 0.25: four actors share a GPU)"""
    ray_resources: dict[str, float] = field(default_factory=dict)
    """custom Ray resources each actor needs (--backend ray), e.g. `--ray-resources rollout 1`
    places the actors only on nodes started with `ray start --resources '{"rollout": 8}'`"""
    n_learners: int = 1
    """learner ranks (ppo, a2c, impala, sac, trpo): each learns on 1/N of every batch's rows
    and the gradients (TRPO: also its Fisher-vector products, line search and statistics) are
    averaged (torch.distributed; see docs/guide-learners.md); 1: learn here"""
    learner_devices: str | None = None
    """one device per learner rank, comma-separated (cuda:0,cuda:1); None: learner_device's
    type, cuda:0..N-1 on GPUs"""
    learner_backend: Literal["local", "ray"] = "local"
    """learner ranks: processes of this machine, or Ray actors that Ray places (the ray extra:
    pip install -e '.[ray]'; joins --ray-address like the batcher; see docs/guide-learners.md)"""
    learner_num_gpus: float = 0.0
    """GPUs Ray reserves for each learner rank (--learner-backend ray; 1: a GPU each, NCCL;
    fractions share a GPU with gloo; 0: the CPU)"""
    learner_num_cpus: float = 1.0
    """CPUs Ray reserves for each learner rank (--learner-backend ray)"""
    learner_resources: dict[str, float] = field(default_factory=dict)
    """custom Ray resources each learner rank needs (--learner-backend ray), e.g.
    `--learner-resources learner 1` places the ranks on nodes started with that resource"""

    def batcher_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`make_batcher` that come from this layout besides the
        devices and sizes: the restart budget and the Ray actors' resources."""
        return {
            "max_restarts": self.max_restarts,
            "ray_actor": {
                "num_cpus_per_actor": self.ray_num_cpus,
                "num_gpus_per_actor": self.ray_num_gpus,
                "resources": dict(self.ray_resources),
            },
        }

    def problems(self) -> list[str]:
        """Every problem of the layout (empty: none), for :class:`~rlstruct.runs.run.RunConfig` to
        list with its own before anything starts."""
        problems = []
        if self.n_learners < 1:
            problems.append(f"n_learners must be >= 1, got {self.n_learners}")
        devices = self.learner_devices.split(",") if self.learner_devices else []
        if devices and len(devices) != self.n_learners:
            problems.append(f"learner_devices names {len(devices)} device(s) ({devices}) for "
                            f"n_learners={self.n_learners}: give one per rank")
        problems += self._learner_problems()
        if self.n_envs < 1:
            problems.append(f"n_envs must be >= 1, got {self.n_envs}")
        if self.n_processes < 0:
            problems.append(f"n_processes must be >= 0 (0: one per core), got {self.n_processes}")
        if self.pipeline < 1:
            problems.append(f"pipeline must be >= 1, got {self.pipeline}")
        for name in ("learner_device", "batcher_device", "eval_device"):
            value = getattr(self, name)
            if value != "auto":
                try:
                    torch.device(value)
                except (RuntimeError, TypeError) as err:
                    problems.append(f"{name} {value!r} is not a device: {err}")
        return problems

    def _learner_problems(self) -> list[str]:
        problems = []
        if self.learner_backend == "ray":
            if importlib.util.find_spec("ray") is None:
                problems.append("learner_backend 'ray' needs Ray, an optional extra: "
                                + install_hint("ray"))
            if self.learner_devices:
                problems.append("learner_devices places local ranks; with learner_backend 'ray' "
                                "Ray places them: ask for learner_num_gpus instead")
            for name in ("learner_num_gpus", "learner_num_cpus"):
                if not getattr(self, name) >= 0:
                    problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
            bad = {k: v for k, v in self.learner_resources.items() if not v >= 0}
            if bad:
                problems.append(f"learner_resources must be >= 0, got {bad}")
        elif self.learner_num_gpus or self.learner_resources or self.learner_num_cpus != 1.0:
            problems.append("learner_num_gpus, learner_num_cpus and learner_resources are Ray's "
                            "placement of the learner ranks: add --learner-backend ray")
        return problems

"""Candidate layouts of the training batcher, and the grid they are drawn from."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlstruct.batchers.make import default_processes
from rlstruct.errors import ConfigError
from rlstruct.runs.layout import LayoutConfig

__all__ = ["AXES", "Candidate", "candidate_grid", "thread_options"]

#: The axes the coordinate search moves along, in sweep order.
AXES: tuple[str, ...] = ("workers", "n_envs", "n_timesteps", "pipeline", "n_threads")


@dataclass(frozen=True, order=True)
class Candidate:
    """One layout of the training batcher.

    Attributes:
        n_processes: 1: a SerialBatcher (collects in this process); ``P >= 2``: a Batcher
            with ``P`` worker processes (CPU only).
        n_envs: envs per process (or in the SerialBatcher).
        n_timesteps: ``T``, steps per env and segment.
        pipeline: segment slots per worker (2: pipelined; worker processes only).
        device: the batcher's device (a GPU selects the SerialBatcher; ``n_processes`` is 1).
        n_threads: torch threads of the learner, in this process (``--n-threads`` of a run;
            the workers keep one each).
    """

    n_processes: int
    n_envs: int
    n_timesteps: int
    pipeline: int = 1
    device: str = "cpu"
    n_threads: int = 1

    def __post_init__(self) -> None:
        problems = [f"{name} must be >= 1, got {getattr(self, name)}"
                    for name in ("n_processes", "n_envs", "n_timesteps", "pipeline", "n_threads")
                    if getattr(self, name) < 1]
        if self.pipeline > 1 and self.n_processes < 2:
            problems.append(f"pipeline={self.pipeline} needs n_processes >= 2")
        if self.device != "cpu" and self.n_processes != 1:
            problems.append(f"a {self.device} batcher is one process: n_processes must be 1")
        if problems:
            raise ConfigError(f"bad candidate {self}: " + "; ".join(problems))

    @property
    def workers(self) -> tuple[str, int]:
        """The value on the ``workers`` axis: ``(device, n_processes)``."""
        return (self.device, self.n_processes)

    def axis(self, name: str) -> Any:
        """The candidate's value on axis ``name`` (one of :data:`AXES`)."""
        return self.workers if name == "workers" else getattr(self, name)

    @property
    def label(self) -> str:
        """A short description, e.g. ``"Batcher 2x32 T=32 pipe2"``, ``"Serial cpu 64 T=16"`` or
        ``"Batcher 2x8 T=32 thr2"`` (learner threads, shown when more than 1)."""
        if self.n_processes == 1:
            where = f"Serial {self.device} {self.n_envs}"
        else:
            where = f"Batcher {self.n_processes}x{self.n_envs}"
        pipe = f" pipe{self.pipeline}" if self.pipeline > 1 else ""
        threads = f" thr{self.n_threads}" if self.n_threads > 1 else ""
        return f"{where} T={self.n_timesteps}{pipe}{threads}"

    def layout(self, base: LayoutConfig | None = None) -> LayoutConfig:
        """``base`` (default: ``LayoutConfig()``) with this candidate's batcher fields (the
        learner's ``n_threads`` is a run's field, not the layout's: see
        :func:`~rlstruct.tools.tune.searches.tuned_layout`)."""
        return dataclasses.replace(
            base or LayoutConfig(), batcher_device=self.device, n_processes=self.n_processes,
            n_envs=self.n_envs, pipeline=self.pipeline,
        )


def thread_options(cores: int | None = None) -> list[int]:
    """The learner thread counts worth trying: 1, 2, 4, ... up to ``cores`` and ``cores``
    itself (default: the cores this process may use).

    Args:
        cores: the usable cores (None: :func:`~rlstruct.batchers.make.default_processes`).
    """
    return _process_options(default_processes() if cores is None else max(1, cores))


def _process_options(cores: int) -> list[int]:
    """1, 2, 4, ... up to ``cores``, and ``cores`` itself."""
    options, p = [1], 2
    while p <= cores:
        options.append(p)
        p *= 2
    if cores not in options:
        options.append(cores)
    return options


def candidate_grid(
    processes: Sequence[int] | None = None,
    n_envs_options: Sequence[int] = (8, 16, 32, 64),
    n_timesteps_options: Sequence[int] = (16, 32, 64),
    pipelines: Sequence[int] = (1, 2),
    devices: Sequence[str] | None = None,
    batch_size: int | None = None,
    n_threads_options: Sequence[int] = (1,),
) -> list[Candidate]:
    """The full grid of valid candidates.

    Args:
        processes: worker counts (1: SerialBatcher); default 1, 2, 4, ... and the core count.
        n_envs_options: envs per process.
        n_timesteps_options: values of ``T``; with ``batch_size``, the range ``T`` may take.
        pipelines: pipeline depths (more than 1 only for ``P >= 2``).
        devices: GPU devices for a SerialBatcher on a GPU (default: ``cuda:0`` when CUDA is
            available, none otherwise).
        batch_size: keep the batch, ``P * n_envs * T`` steps, at this size while the layout
            varies (an on-policy algorithm's hyperparameter): ``T`` is derived from ``P`` and
            ``n_envs``, and a layout is kept when ``T`` is a whole number between the smallest
            and the largest of ``n_timesteps_options``. None: every ``T`` of the options.
        n_threads_options: the learner's torch threads (see :func:`thread_options`).

    Returns:
        The candidates, CPU ones first.

    Raises:
        ConfigError: ``batch_size`` is below 1, or no layout reaches it.
    """
    procs = list(processes) if processes is not None else _process_options(default_processes())
    if devices is None:
        devices = ["cuda:0"] if torch.cuda.is_available() else []
    out = []
    for n_envs, th in ((n, th) for n in n_envs_options for th in n_threads_options):
        for p in procs:
            for t in _timesteps(p * n_envs, n_timesteps_options, batch_size):
                out.extend(Candidate(p, n_envs, t, pipe, n_threads=th) for pipe in pipelines
                           if pipe == 1 or p >= 2)
        for t in _timesteps(n_envs, n_timesteps_options, batch_size):
            out.extend(Candidate(1, n_envs, t, 1, str(d), th) for d in devices)
    if batch_size is not None and not out:
        raise ConfigError(
            f"no layout of processes {procs} x n_envs {list(n_envs_options)} gives a batch of "
            f"{batch_size} steps with T between {min(n_timesteps_options)} and "
            f"{max(n_timesteps_options)}")
    return sorted(set(out), key=lambda c: (c.device != "cpu", c))


def _timesteps(rows: int, options: Sequence[int], batch_size: int | None) -> list[int]:
    """The ``T`` values of a layout with ``rows`` envs in all."""
    if batch_size is None:
        return list(options)
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    t, rest = divmod(batch_size, rows)
    return [t] if rest == 0 and min(options) <= t <= max(options) else []

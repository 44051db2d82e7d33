"""The layout a run takes from the machine it starts on (``--layout auto``).

A preset says what changes learning: the envs in all, ``T``, epochs, minibatches, learning
rate. The layout says where the work runs: worker processes, envs per worker, learner threads,
devices. ``--layout auto`` keeps the first and picks the second for this machine:

- **the envs in all stay**: ``n_processes x n_envs`` is the config's (the preset's) total, split
  over as many worker processes as divide it evenly and the machine has cores for;
- **the learner** goes to the GPU when there is one (``--learner-device auto`` already does):
  one thread, which feeds it. On the CPU it takes every core while the workers wait
  (``--pipeline 1``: collect, then learn), or the cores the workers leave and one more
  (``--pipeline 2``: both at once; workers wait on their envs and their turn part of the time,
  as the presets measured), at least two where the machine has two cores: a pipelined learner
  on a CNN sets the pace (APPO's and IMPALA's Pong presets, docs/results.md);
- **workers**: as many as divide the envs evenly and the machine has cores (one core left to
  feed a GPU learner); ``--n-processes 0`` (one per core) and a run that collects in its own
  process (``--n-processes 1``, ``--pipeline 1``) keep theirs;
- **the env backend**: an Atari run (``--env-backend atari``) steps its envs with envpool
  (``--env-backend envpool``: the same game and preprocessing, each worker's envs in one
  envpool of the worker's share of the cores) where envpool is installed: as fast or faster
  in each preset measured on the 2-core machine (docs/guide-gpus.md); other backends stay;
- ``T``, the pipeline and the devices of the batcher and of the evaluation stay the config's.

On the 2-core machine the rule gives the presets' own layouts (PPO, A2C, DQN, IMPALA and APPO
on Atari: 2 workers and their threads; SAC: its one env in this process), which the presets
were measured with; on a 16-core machine with a GPU, PPO's 8 Atari envs go to 8 workers and the
learner to the GPU. ``config.json`` records ``layout_source: "auto"`` and the machine.

Example:
    >>> from rlstruct.runs.layout import LayoutConfig
    >>> choice = auto_layout(LayoutConfig(n_processes=2, n_envs=4), Machine(16, 1, False))
    >>> (choice.n_processes, choice.n_envs, choice.n_threads, choice.learner_device)
    (8, 1, 1, 'cuda')
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Machine", "LayoutChoice", "auto_layout", "apply_auto_layout", "machine_dict", "AUTO"]

#: The ``--layout`` value that picks the layout from the machine.
AUTO = "auto"


@dataclass(frozen=True)
class Machine:
    """What the rule reads of a machine.

    Attributes:
        cores: CPU cores this process may use (its affinity mask, else ``os.cpu_count()``).
        gpus: CUDA devices torch sees.
        envpool: whether ``envpool`` is importable (an Atari run then steps its envs with it).
    """

    cores: int
    gpus: int
    envpool: bool

    @classmethod
    def here(cls) -> Machine:
        """The machine this process runs on."""
        import torch

        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not on Linux
            cores = os.cpu_count() or 1
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return cls(cores, gpus, importlib.util.find_spec("envpool") is not None)


@dataclass(frozen=True)
class LayoutChoice:
    """What :func:`auto_layout` picked, and why (``reason``: one line for ``config.json``)."""

    n_processes: int
    n_envs: int
    n_threads: int
    learner_device: str
    reason: str
    env_backend: str = "gymnasium"


def _largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` that is at most ``at_most`` (at least 1)."""
    return max(d for d in range(1, max(1, min(n, at_most)) + 1) if n % d == 0)


def auto_layout(layout: Any, machine: Machine, env_backend: str = "gymnasium") -> LayoutChoice:
    """The layout of :mod:`this module's rule <rlstruct.runs.machine>` for ``machine``.

    Args:
        layout: the config's :class:`~rlstruct.runs.layout.LayoutConfig` (its envs in all,
            pipeline and learner device are kept).
        machine: the machine to lay the run out on.
        env_backend: the config's ``env_backend`` (``atari`` becomes ``envpool`` where envpool
            is installed).

    Returns:
        The worker processes, envs per worker, learner threads (the config's are replaced,
        whatever they were), learner device and env backend.
    """
    dev, pipelined = layout.learner_device, layout.pipeline >= 2
    gpu = dev.startswith("cuda") or (dev == "auto" and machine.gpus > 0)
    device = "cuda" if gpu and dev == "auto" else dev
    total = layout.n_processes * layout.n_envs
    if layout.n_processes == 0:  # one worker per core already: the envs in all follow the cores
        workers, total = 0, layout.n_envs * machine.cores
    elif layout.n_processes == 1 and not pipelined:  # collected in this process: nothing to split
        workers = 1
    else:  # one core feeds a GPU learner; on the CPU the workers may take every core
        workers = _largest_divisor(total, max(1, machine.cores - 1) if gpu else machine.cores)
    if gpu:
        threads = 1
    elif pipelined:  # workers and learner at once: the learner takes the cores they leave,
        spare = machine.cores - (workers or machine.cores) + 1  # and one (they wait); 2 at least
        threads = min(machine.cores, max(2, spare))
    else:  # collect, then learn: each takes every core in turn
        threads = machine.cores
    n_envs = total // workers if workers > 0 else layout.n_envs
    backend = "envpool" if env_backend == "atari" and machine.envpool else env_backend
    reason = (f"{machine.cores} cores, {machine.gpus} GPUs, envpool "
              f"{'installed' if machine.envpool else 'absent'}: {total} envs in "
              f"{workers or 'one per core'} x {n_envs}, learner on {device} with {threads} "
              f"threads, pipeline {layout.pipeline}, env backend {backend}")
    return LayoutChoice(workers, n_envs, threads, device, reason, backend)


def apply_auto_layout(cfg: Any, machine: Machine | None = None) -> str:
    """Sets ``cfg.layout`` (processes, envs per worker, learner device), ``cfg.n_threads`` and
    ``cfg.env_backend`` from :func:`auto_layout`, in place; returns the choice's reason.

    Args:
        cfg: a :class:`~rlstruct.runs.config.RunConfig`.
        machine: the machine (default: this one, :meth:`Machine.here`).
    """
    import dataclasses

    machine = machine or Machine.here()
    choice = auto_layout(cfg.layout, machine, cfg.env_backend)
    cfg.layout = dataclasses.replace(cfg.layout, n_processes=choice.n_processes,
                                     n_envs=choice.n_envs, learner_device=choice.learner_device)
    cfg.n_threads = choice.n_threads
    cfg.env_backend = choice.env_backend
    return choice.reason


def machine_dict(machine: Machine | None = None) -> dict[str, Any]:
    """The machine's facts as ``config.json`` records them."""
    return asdict(machine or Machine.here())

"""Seeds: which seed each env and agent gets, and the RNG streams the agents' code runs under.

Env seeds depend on the run seed and the GLOBAL env index only (:func:`env_seed_bases`). Agents
often sample from the process-wide generators (``torch.distributions.Categorical(...).sample()``,
``numpy.random``, ``random``) and build their models in ``create_agent`` without a seed, so a
batcher also owns those streams:

- a ``Batcher`` worker seeds the global generators of its process with its agent seed
  (:func:`seed_global_rngs`) before it builds its env and its agent;
- a ``SerialBatcher`` runs everything it does (building, resetting, stepping, updating) under an
  :class:`RNGStreams` of its own, seeded the same way, swapped in and out around each call, so the
  caller's streams are neither read nor advanced.

So a ``SerialBatcher`` and a one-process ``Batcher`` with the same seeds collect bitwise-equal
data, whatever the agent samples from.
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from rlstruct.errors import ConfigError

__all__ = [
    "SEED_BLOCK",
    "env_seed_bases",
    "seed_global_rngs",
    "isolated_rngs",
    "RNGStreams",
]

#: Env seeds of one run seed live in a block of this many seeds, so runs with neighbouring run
#: seeds never share an env seed (up to this many envs per run).
SEED_BLOCK = 1 << 20


def env_seed_bases(
    seeds: int | Sequence[int], n_processes: int, n_envs: int
) -> tuple[list[int], list[int]]:
    """The seed of env 0 of each process, and the default agent seed of each process.

    With an int run seed ``s``, the env of global index ``g`` gets seed ``s * 2**20 + g``: it
    depends on the run seed and the GLOBAL env index only, so P=1 and P=2 with the same total
    number of envs give every env the same seed, and runs with seeds s and s+1 share no env seed.
    The agent of process ``p`` gets ``s * 2**20 + 2**19 + p``.
    With a list (one int per process, as rlstructures), env ``k`` of process ``p`` uses
    ``seeds[p] + k`` and the agent of process ``p`` uses ``seeds[p]``; overlapping ranges are
    refused.

    Args:
        seeds: the run seed, or one seed per process.
        n_processes: P.
        n_envs: envs per process.

    Returns:
        ``(env_bases, agent_seeds)``, one entry per process.

    Raises:
        ConfigError: wrong list length, negative seeds or overlapping env seeds.
    """
    if isinstance(seeds, bool) or not isinstance(seeds, (int, Sequence)):
        raise ConfigError(f"seeds must be an int or a list of ints, got {type(seeds).__name__}")
    if isinstance(seeds, int):
        if seeds < 0:
            raise ConfigError(f"seeds must be >= 0, got {seeds}")
        bases = [seeds * SEED_BLOCK + p * n_envs for p in range(n_processes)]
        return bases, [seeds * SEED_BLOCK + SEED_BLOCK // 2 + p for p in range(n_processes)]
    seeds = list(seeds)
    if len(seeds) != n_processes:
        raise ConfigError(
            f"seeds has {len(seeds)} entries, expected one per process ({n_processes})"
        )
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int) or s < 0]
    if bad:
        raise ConfigError(f"seeds must be non-negative ints, got {bad}")
    order = sorted(range(n_processes), key=lambda p: seeds[p])
    for a, b in itertools.pairwise(order):
        if seeds[b] < seeds[a] + n_envs:
            raise ConfigError(
                f"env seeds overlap: process {a} uses seeds {seeds[a]}..{seeds[a] + n_envs - 1} "
                f"and process {b} starts at {seeds[b]}; space the per-process seeds by at least "
                f"n_envs={n_envs}, or pass one int run seed"
            )
    return seeds, list(seeds)


def _cuda_index(device: torch.device | None) -> int | None:
    if device is None or device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def seed_global_rngs(seed: int, device: torch.device | None = None) -> None:
    """Seeds torch's CPU generator, numpy's and ``random``'s global generators with ``seed``.

    Args:
        seed: a non-negative int (numpy gets ``seed % 2**32``).
        device: a CUDA device whose default generator is seeded too; no other GPU is touched
            (``torch.manual_seed`` would queue a seed for every GPU, even unused ones).
    """
    torch.default_generator.manual_seed(seed)
    index = _cuda_index(device)
    if index is not None:
        torch.cuda.default_generators[index].manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def _get_states(cuda: int | None) -> tuple[Any, ...]:
    return (
        torch.get_rng_state(),
        None if cuda is None else torch.cuda.get_rng_state(cuda),
        np.random.get_state(),
        random.getstate(),
    )


def _set_states(states: tuple[Any, ...], cuda: int | None) -> None:
    torch_state, cuda_state, np_state, py_state = states
    torch.set_rng_state(torch_state)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda_state, cuda)
    np.random.set_state(np_state)
    random.setstate(py_state)


@contextlib.contextmanager
def isolated_rngs(device: torch.device | None = None) -> Iterator[None]:
    """Runs the block with the global generators saved and restored around it.

    Whatever the block draws (a throwaway agent's model initialisation, a probe call that
    samples) leaves the caller's streams exactly where they were.

    Args:
        device: a CUDA device whose generator is saved and restored too.
    """
    cuda = _cuda_index(device)
    saved = _get_states(cuda)
    try:
        yield
    finally:
        _set_states(saved, cuda)


class RNGStreams:
    """Global-generator streams owned by one batcher, swapped in around each of its calls.

    Args:
        seed: seeds the streams as :func:`seed_global_rngs` seeds a worker process.
        device: a CUDA device whose generator belongs to the streams too.

    Examples:
        >>> streams = RNGStreams(7)
        >>> with streams.active():
        ...     a = torch.rand(2)
        >>> torch.manual_seed(7); b = torch.rand(2)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> bool((a == b).all())
        True
    """

    def __init__(self, seed: int, device: torch.device | None = None) -> None:
        self._cuda = _cuda_index(device)
        with isolated_rngs(device):
            seed_global_rngs(seed, device)
            self._states = _get_states(self._cuda)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Runs the block on these streams; the caller's streams are restored afterwards."""
        saved = _get_states(self._cuda)
        _set_states(self._states, self._cuda)
        try:
            yield
        finally:
            self._states = _get_states(self._cuda)
            _set_states(saved, self._cuda)

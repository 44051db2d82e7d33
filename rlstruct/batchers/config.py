"""Validation of a batcher's configuration, seed derivation and model copies through the CPU.

Everything here runs in the calling process before any worker starts, so a bad configuration
costs milliseconds and leaves no process behind.
"""

from __future__ import annotations

import io
import itertools
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cloudpickle
import torch
from torch import nn

from rlstruct.dicttensor import DictTensor
from rlstruct.errors import ConfigError

__all__ = [
    "env_seed_bases",
    "check_picklable",
    "find_non_cpu",
    "cpu_copy",
    "to_cpu_bytes",
    "from_cpu_bytes",
    "broadcast_rows",
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
    number of envs collect the same data, and runs with seeds s and s+1 share no env seed.
    With a list (one int per process, as rlstructures), env ``k`` of process ``p`` uses
    ``seeds[p] + k``; overlapping ranges are refused.

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


def check_picklable(**objects: Any) -> None:
    """Checks that each named object can be sent to a spawned worker (with cloudpickle).

    Raises:
        TypeError: naming the first argument that cannot be pickled and why.
    """
    for name, obj in objects.items():
        try:
            cloudpickle.dumps(obj)
        except Exception as e:  # pickling raises many types (TypeError, PicklingError, ...)
            raise TypeError(
                f"{name} cannot be sent to a worker process: {type(e).__name__}: {e}. "
                "Factories and their arguments must be picklable (lambdas and closures are fine; "
                "open files, locks, sockets and CUDA streams are not)"
            ) from e


def find_non_cpu(obj: Any, path: str = "", depth: int = 0) -> list[str]:
    """Paths (like ``agent_args['model']``) of tensors or modules in ``obj`` not on the CPU."""
    if depth > 6:
        return []
    if isinstance(obj, torch.Tensor):
        return [f"{path} on {obj.device}"] if obj.device.type != "cpu" else []
    if isinstance(obj, nn.Module):
        for t in list(obj.parameters()) + list(obj.buffers()):
            if t.device.type != "cpu":
                return [f"{path} (a {type(obj).__name__}) on {t.device}"]
        return []
    if isinstance(obj, DictTensor):
        device = obj.device()
        return [f"{path} on {device}"] if device is not None and device.type != "cpu" else []
    found: list[str] = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            found += find_non_cpu(v, f"{path}[{k!r}]", depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            found += find_non_cpu(v, f"{path}[{i}]", depth + 1)
    return found


def to_cpu_bytes(obj: Any) -> bytes:
    """Serialises ``obj`` (tensors, modules, closures) so that :func:`from_cpu_bytes` reads it back
    with every tensor on the CPU."""
    buffer = io.BytesIO()
    torch.save(obj, buffer, pickle_module=cloudpickle)
    return buffer.getvalue()


def from_cpu_bytes(blob: bytes) -> Any:
    """Reads what :func:`to_cpu_bytes` wrote, mapping every tensor to the CPU."""
    return torch.load(
        io.BytesIO(blob), map_location="cpu", weights_only=False, pickle_module=pickle
    )


def cpu_copy(obj: Any) -> Any:
    """A deep copy of ``obj`` whose tensors (and modules' parameters) all live on the CPU.

    The copy goes through a serialised form read back with ``map_location="cpu"``, so copying a
    model that lives on cuda:0 for a batcher on cuda:1 never allocates anything new on cuda:0.
    """
    return from_cpu_bytes(to_cpu_bytes(obj))


def broadcast_rows(example: DictTensor | None, n: int, name: str) -> DictTensor:
    """``example`` as ``n`` rows on the CPU: kept if it has ``n`` rows, repeated if it has one.

    Raises:
        ConfigError: another number of rows.
    """
    if example is None or example.empty():
        return DictTensor(batch_size=n, device="cpu")
    example = example.to("cpu")
    b = example.n_elems()
    if b == n:
        return example.clone()
    if b == 1:
        return example.index(torch.zeros(n, dtype=torch.long))
    raise ConfigError(f"{name} has {b} rows, expected {n} (one per env) or 1 (shared by all)")


def describe_factory(fn: Callable[..., Any]) -> str:
    """A short name for a factory in error messages."""
    return getattr(fn, "__qualname__", None) or repr(fn)

"""What a run that learns from a :class:`~rlstruct.blocks.replay_buffer.ReplayBuffer` (SAC, DQN)
configures and checks before it starts: the ``checkpoint_buffer`` config field
(:class:`ReplayCheckpoint`) and whether the buffer fits in memory
(:func:`replay_memory_problems`). Both are re-exported by :mod:`rlstruct.blocks.replay_buffer`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlstruct.dicttensor import DeviceLike, _same_device
from rlstruct.errors import ConfigError, DeviceContractError
from rlstruct.keys import AGENT_INFO, AGENT_STATE, ENV_ID, ENV_INFO, LENGTHS, POLICY_VERSION

__all__ = ["ReplayCheckpoint", "buffer_device", "buffer_generator", "buffer_keys",
           "replay_memory_problems"]

_INFO_KEYS = (AGENT_INFO, ENV_INFO, AGENT_STATE, ENV_ID, POLICY_VERSION)


def buffer_device(device: DeviceLike, owner: str) -> torch.device:
    """The canonical device of a buffer's storage (``cuda`` -> ``cuda:<current>``).

    Raises:
        ConfigError: naming ``owner``, when nothing can be allocated there.
    """
    try:
        return torch.empty(0, device=device).device
    except (RuntimeError, AssertionError, TypeError) as e:
        # torch raises AssertionError for "cuda" in a CPU-only build.
        raise ConfigError(f"{owner}: cannot allocate on device {device!r}: {e}") from e


def buffer_keys(keys: Sequence[str] | None, owner: str) -> tuple[str, ...] | None:
    """The trajectory keys a buffer stores (``None``: every key of the first batch).

    Raises:
        ConfigError: naming ``owner``, when ``keys`` is a str, empty, repeats a key or names
            ``lengths`` or a per-row info key.
    """
    if keys is None:
        return None
    if isinstance(keys, str):
        raise ConfigError(
            f"{owner}: keys must be a sequence of key names, got the str {keys!r}; "
            f"write keys=[{keys!r}]"
        )
    keys = tuple(keys)
    if not keys:
        raise ConfigError(f"{owner}: keys is empty; pass None to store every trajectory key")
    for k in keys:
        if not isinstance(k, str):
            raise ConfigError(f"{owner}: keys must be str, got {type(k).__name__} ({k!r})")
        if k == LENGTHS or k.startswith(_INFO_KEYS):
            raise ConfigError(
                f"{owner}: cannot store {k!r}: only trajectory keys (observation/*, "
                "action/*, _observation/*) are stored, not lengths or per-row info"
            )
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ConfigError(f"{owner}: keys {dup} are given more than once")
    return keys


def buffer_generator(generator: torch.Generator | None, device: torch.device,
                     owner: str) -> torch.Generator | None:
    """``generator``, checked to be a ``torch.Generator`` on the buffer's ``device``.

    Raises:
        TypeError: it is not a ``torch.Generator``.
        DeviceContractError: it lives on another device than ``device``.
    """
    if generator is None:
        return None
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"{owner}: generator must be a torch.Generator, got {type(generator).__name__}")
    if device.type != "meta" and not _same_device(generator.device, device):
        raise DeviceContractError(
            f"{owner}: generator is on {generator.device}, expected {device} like the storage; "
            f"use torch.Generator(device={str(device)!r})",
            argument="generator", expected=device, actual=generator.device,
        )
    return generator


@dataclass
class ReplayCheckpoint:
    """The config field of the algorithms that learn from a :class:`ReplayBuffer` (SAC, DQN):
    their ``Config`` subclasses it beside ``RunConfig``, and passes the buffer to
    ``run.resume_state`` when it is on."""

    checkpoint_buffer: bool = True
    """save the replay buffer with each checkpoint (checkpoints/buffer.pt), so that --resume
    continues with it; off: a resumed run starts with an empty buffer"""


def replay_memory_problems(buffer_size: int, obs_shape: Sequence[int], obs_itemsize: int,
                           action_numel: int, field: str = "buffer_size",
                           stacked: bool = False) -> list[str]:
    """Whether a replay buffer of ``buffer_size`` transitions fits in this machine's memory:
    ``[]``, or one problem naming ``field``, the bytes it needs and the memory available.

    A transition holds the observation and the next one (``obs_shape`` of ``obs_itemsize``
    bytes each), the action (``action_numel`` numbers, 8 bytes counted each), the reward and
    two flags; the estimate is a lower bound. ``stacked``: a
    :class:`~rlstruct.blocks.frame_buffer.FrameReplayBuffer` of stacks ``(K, *frame)``, one
    frame (2% more) and ``2 K`` frame numbers a transition.

    Examples:
        >>> replay_memory_problems(10**6, (3,), 4, 1)
        []
        >>> "buffer_size 1,000,000,000,000 needs" in replay_memory_problems(10**12, (3,), 4, 1)[0]
        True
    """
    import psutil

    if stacked:
        frame = math.prod(obs_shape[1:]) * obs_itemsize
        per = int(1.02 * frame) + 16 * obs_shape[0] + 8 * action_numel + 4 + 2
    else:
        per = 2 * math.prod(obs_shape) * obs_itemsize + 8 * action_numel + 4 + 2
    need = buffer_size * per
    available = psutil.virtual_memory().available
    if need <= available:
        return []
    return [f"{field} {buffer_size:,} needs about {need / 2**30:,.1f} GiB for its transitions "
            f"({per} bytes each), but this machine has {available / 2**30:,.1f} GiB available: "
            f"lower --{field.replace('_', '-')}"]

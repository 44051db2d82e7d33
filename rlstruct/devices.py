"""Device specs from configs and command lines, resolved and checked before anything starts.

A config says ``device: str = "auto"``; :func:`resolve_device` turns it into a concrete
``torch.device`` or raises :class:`~rlstruct.errors.ConfigError` naming the spec and the devices
that exist, so a run asking for ``cuda:3`` on a one-GPU machine fails at once, not mid-training.

Example:
    >>> resolve_device("cpu")
    device(type='cpu')
    >>> is_accelerator("cpu"), is_accelerator("cuda:1"), is_accelerator("meta")
    (False, True, False)
    >>> torch.device("cpu") in available_devices()
    True
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from rlstruct.errors import ConfigError

__all__ = [
    "resolve_device", "is_accelerator", "available_devices", "session_device", "bf16_native",
    "learner_autocast", "DeviceLike", "as_device", "same_device",
]

#: What a device argument accepts: a ``torch.device``, its name (``"cuda:0"``) or a CUDA index.
DeviceLike = str | torch.device | int

# Device types that hold no real memory to compute on, or that are the host.
_NOT_ACCELERATORS = frozenset({"cpu", "meta"})


def resolve_device(spec: str | torch.device) -> torch.device:
    """Resolve a device spec into a concrete, available ``torch.device``.

    Args:
        spec: ``"auto"`` (``cuda:0`` when CUDA is available, else ``cpu``), ``"cpu"``,
            ``"cuda"`` (means ``cuda:0``), ``"cuda:N"``, ``"meta"``, ``"mps"``, ``"xpu[:N]"``,
            or a ``torch.device``.

    Returns:
        The device, always with an index for indexed backends (``cuda`` -> ``cuda:0``);
        ``cpu`` never carries one (``cpu:0`` -> ``cpu``), so resolved devices compare equal.

    Raises:
        ConfigError: the spec is malformed, or names a backend or index this machine lacks.
    """
    if isinstance(spec, str) and spec.strip().lower() == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(spec.strip() if isinstance(spec, str) else spec)
    except (RuntimeError, TypeError, ValueError) as err:
        raise ConfigError(
            f"device {spec!r} is not a device spec ({err}); expected 'auto', 'cpu', 'cuda', "
            f"'cuda:N' or 'meta' (available here: {_names()})"
        ) from None
    if device.type in ("cpu", "meta"):
        return torch.device(device.type)
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"device {spec!r}: MPS is not available (available: {_names()})")
        return torch.device("mps")
    backend = getattr(torch, device.type, None)
    if backend is None or not hasattr(backend, "device_count"):
        raise ConfigError(f"device {spec!r}: unsupported device type (available: {_names()})")
    if not backend.is_available():
        raise ConfigError(
            f"device {spec!r}: {device.type.upper()} is not available on this machine "
            f"(available: {_names()}); use 'cpu' or 'auto'"
        )
    index = 0 if device.index is None else device.index
    count = backend.device_count()
    if index >= count:
        raise ConfigError(
            f"device {spec!r}: index {index} is out of range, this machine has {count} "
            f"{device.type} device(s) (available: {_names()})"
        )
    return torch.device(device.type, index)


def is_accelerator(device: str | torch.device) -> bool:
    """Whether ``device`` is an accelerator (cuda, mps, xpu, ...) rather than the host or meta.

    Only the device type is looked at: ``is_accelerator("cuda:7")`` is true even on a machine
    without that GPU (use :func:`resolve_device` to check availability). ``"auto"`` is resolved.
    """
    if isinstance(device, str) and device.strip().lower() == "auto":
        device = resolve_device("auto")
    return torch.device(device).type not in _NOT_ACCELERATORS


def available_devices() -> list[torch.device]:
    """The devices usable on this machine: ``cpu``, then every CUDA device, then MPS/XPU."""
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        devices.append(torch.device("mps"))
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        devices += [torch.device("xpu", i) for i in range(xpu.device_count())]
    return devices


def session_device(
    trial: int, session: int, sessions_per_trial: int, n_gpus: int, offset: int = 0
) -> torch.device:
    """The learner device of one session of a sweep: GPUs taken in turn across trials.

    ``cuda:((trial * sessions_per_trial + session + offset) % n_gpus)``, or the CPU when
    ``n_gpus`` is 0: SLM-Lab's rotation, where ``offset`` is its ``CUDA_OFFSET`` (start a second
    sweep on the GPUs the first one leaves free). A pure function: it makes no CUDA call and does
    not check that the GPU exists (:func:`resolve_device` does, in the session).

    Example:
        >>> [str(session_device(0, s, 4, n_gpus=2)) for s in range(4)]
        ['cuda:0', 'cuda:1', 'cuda:0', 'cuda:1']
        >>> [str(session_device(0, s, 4, n_gpus=8, offset=4)) for s in range(4)]
        ['cuda:4', 'cuda:5', 'cuda:6', 'cuda:7']
        >>> session_device(3, 1, 4, n_gpus=0)
        device(type='cpu')

    Args:
        trial: the trial (config variant) index, >= 0.
        session: the session (seed) index inside the trial, ``0 <= session <
            sessions_per_trial``.
        sessions_per_trial: sessions per trial, >= 1.
        n_gpus: GPUs to rotate over, >= 0 (0: CPU).
        offset: added before the modulo, >= 0.

    Raises:
        TypeError: an argument is not an ``int`` (``bool`` included).
        ConfigError: an argument is negative, ``sessions_per_trial`` is 0, or ``session`` is not
            below ``sessions_per_trial``.
    """
    args = {"trial": trial, "session": session, "sessions_per_trial": sessions_per_trial,
            "n_gpus": n_gpus, "offset": offset}
    for name, value in args.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"session_device: {name} must be an int, got {value!r}")
    negative = [f"{name}={value}" for name, value in args.items() if value < 0]
    if negative:
        raise ConfigError(f"session_device: arguments must be >= 0, got {', '.join(negative)}")
    if sessions_per_trial < 1:
        raise ConfigError("session_device: sessions_per_trial must be >= 1, got 0")
    if session >= sessions_per_trial:
        raise ConfigError(f"session_device: session {session} is out of range for "
                          f"{sessions_per_trial} sessions per trial")
    if n_gpus == 0:
        return torch.device("cpu")
    return torch.device("cuda", (trial * sessions_per_trial + session + offset) % n_gpus)


def bf16_native(device: str | torch.device) -> bool:
    """Whether ``device`` computes bfloat16 natively: a CUDA device that supports it, or a CPU
    with AVX512-BF16 or AMX (on other CPUs bfloat16 is emulated, and slower than float32)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        cpu: Any = torch.cpu
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
    return False


def learner_autocast(device: str | torch.device,
                     precision: str) -> contextlib.AbstractContextManager:
    """The context a learn step runs in for ``--precision``: ``"fp32"`` (nothing), ``"bf16"``
    (``torch.autocast`` to bfloat16 on ``device``: matmuls and convolutions in bfloat16, weights,
    gradients and optimizer state in float32) or ``"auto"`` (bf16 where
    :func:`bf16_native`, else fp32).

    The autocast context keeps no cast cache: a learn step runs many optimizer steps in one
    context, and each forward must see the weights as the last step left them (with the cache,
    PPO's Nature CNN learned on its first minibatch's weights all through a learn step and did
    not learn Pong).

    Raises:
        ConfigError: ``precision`` is none of the three.
    """
    if precision not in ("fp32", "bf16", "auto"):
        raise ConfigError(f"precision must be 'fp32', 'bf16' or 'auto', got {precision!r}")
    device = torch.device(device)
    if precision == "fp32" or (precision == "auto" and not bf16_native(device)):
        return contextlib.nullcontext()
    # No cast cache: autocast keeps its bfloat16 copy of each weight for the whole context, and
    # a learn step is many optimizer steps in one context, whose forwards must see the updates.
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)


def _names() -> str:
    return ", ".join(str(d) for d in available_devices())


def as_device(device: DeviceLike | None) -> torch.device | None:
    """``device`` as a ``torch.device`` (``None`` stays ``None``).

    Examples:
        >>> as_device("cpu"), as_device(None)
        (device(type='cpu'), None)
    """
    if device is None or isinstance(device, torch.device):
        return device
    return torch.device(device)


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether ``a`` and ``b`` name the same device, a device given without an index matching
    any index of its type (``cuda`` and ``cuda:0``: tensors always carry an index).

    Examples:
        >>> same_device(torch.device("cuda"), torch.device("cuda:1"))
        True
        >>> same_device(torch.device("cpu"), torch.device("cuda:0"))
        False
    """
    if a == b:
        return True
    return a.type == b.type and (a.index is None or b.index is None)

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

import torch

from rlstruct.errors import ConfigError

__all__ = ["resolve_device", "is_accelerator", "available_devices"]

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


def _names() -> str:
    return ", ".join(str(d) for d in available_devices())

"""The checks of what a user hands a :class:`~rlstruct.envs.torch.TorchVecEnv`: its constructor's
numbers and device, its reset options (``env_info``) and a state set by hand. Each raises a typed
error that names the argument and what was expected.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from rlstruct.devices import same_device
from rlstruct.dicttensor import DictTensor
from rlstruct.errors import ConfigError, DeviceContractError, KeyMismatchError, ShapeError

__all__: list[str] = []


def check_int(name: str, value: object, minimum: int) -> None:
    """Raises a :class:`~rlstruct.errors.ConfigError` unless ``value`` is an int (not a bool)
    >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")


def usable_device(device: str | torch.device) -> torch.device:
    """``device`` with its index (``"cuda"`` -> ``cuda:0``), checked by allocating on it.

    Raises:
        ConfigError: the device does not exist here, or it is ``meta`` (it holds no values).
    """
    try:
        dev = torch.device(device)
        probe = torch.zeros(1, device=dev)
    except (RuntimeError, TypeError, ValueError, AssertionError) as e:  # no CUDA: Assertion
        raise ConfigError(f"device {device!r} is not usable: {e}") from e
    if dev.type == "meta":
        raise ConfigError("device 'meta' holds no values: a TorchVecEnv cannot run there")
    return probe.device


def default_options(
    reset_options: Mapping[str, float], n: int, dtype: torch.dtype, device: torch.device
) -> dict[str, Tensor]:
    """``{name: (n,) tensor of its default}`` for each reset option of ``reset_options``."""
    return {
        name: torch.full((n,), float(v), dtype=dtype, device=device)
        for name, v in reset_options.items()
    }


def parse_options(
    env_info: DictTensor | None, defaults: dict[str, Tensor], n: int, device: torch.device,
    dtype: torch.dtype, env_name: str,
) -> dict[str, Tensor]:
    """The reset options of ``env_info`` over ``defaults`` (see :func:`default_options`), each
    moved to ``device`` and ``dtype``; ``defaults`` itself when ``env_info`` is ``None`` or
    empty.

    Args:
        env_info: ``None`` or a DictTensor ``(n,)`` of reset options (on any device).
        defaults: ``{name: (n,)}``, every reset option the env takes; updated and returned.
        n: the number of envs.
        device: the env's device.
        dtype: the env's state dtype.
        env_name: the env's class name, for the messages.

    Raises:
        TypeError: ``env_info`` is not a DictTensor.
        ShapeError: ``env_info`` has not one row per env, or a key is not ``(n,)`` real numbers.
        KeyMismatchError: a key is not a reset option of the env.
    """
    options = defaults
    if env_info is None:
        return options
    if not isinstance(env_info, DictTensor):
        raise TypeError(f"env_info must be a DictTensor or None, got {type(env_info).__name__}")
    if env_info.empty():
        return options
    if env_info.n_elems() != n:
        raise ShapeError(f"env_info has {env_info.n_elems()} rows, expected {n} (one per env)")
    unknown = sorted(set(env_info.keys()) - set(options))
    if unknown:
        raise KeyMismatchError(
            f"env_info has keys {unknown} that {env_name} does not take; its "
            f"reset options are {sorted(options)}"
        )
    for name, v in env_info.items():
        if v.dim() != 1 or v.dtype.is_complex or v.dtype == torch.bool:
            raise ShapeError(
                f"env_info[{name!r}] is {tuple(v.shape)} {v.dtype}, expected ({n},) "
                "real numbers (one value per env)"
            )
        options[name] = v.to(device, dtype)
    return options


def check_state(value: Tensor, state: Tensor) -> None:
    """Checks that ``value`` can be copied into the live state ``state`` ``(N, d)`` as it is:
    a tensor of its shape, device and dtype (no silent cast).

    Raises:
        TypeError: ``value`` is not a tensor, or has another dtype.
        ShapeError: another shape.
        DeviceContractError: another device.
    """
    if not isinstance(value, Tensor):
        raise TypeError(f"state must be a torch.Tensor, got {type(value).__name__}")
    if tuple(value.shape) != tuple(state.shape):
        raise ShapeError(
            f"state has shape {tuple(value.shape)}, expected {tuple(state.shape)} "
            "(n_envs, state_size)"
        )
    if not same_device(value.device, state.device):
        raise DeviceContractError(
            f"state is on {value.device}, expected {state.device} (the env's device)",
            argument="state",
            expected=state.device,
            actual=value.device,
        )
    if value.dtype != state.dtype:
        raise TypeError(
            f"state has dtype {value.dtype}, expected {state.dtype} (the env's dtype); "
            f"pass value.to({state.dtype}) (no silent cast)"
        )

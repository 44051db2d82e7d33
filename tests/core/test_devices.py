"""rlstruct.devices: resolving device specs, with CUDA faked where the machine has none."""

from __future__ import annotations

import pytest
import torch

from rlstruct.devices import available_devices, is_accelerator, resolve_device
from rlstruct.errors import ConfigError, RLStructError


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend there are two CUDA devices (resolution only looks at availability and count)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")
def test_auto_is_cpu_on_this_machine() -> None:
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"'cuda:3'.*available: cpu"):
        resolve_device("cuda:3")


def test_auto_without_and_with_cuda(no_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda", 0)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("cpu", "cpu"), ("cpu:0", "cpu"), (" cpu ", "cpu"), ("meta", "meta"),
     (torch.device("cpu"), "cpu"), (torch.device("meta"), "meta")],
)
def test_host_and_meta(spec: str | torch.device, expected: str) -> None:
    device = resolve_device(spec)
    assert device == torch.device(expected) and device.index is None


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3", torch.device("cuda", 1)])
def test_cuda_unavailable_raises_config_error(no_cuda: None, spec: str | torch.device) -> None:
    with pytest.raises(ConfigError, match=r"is not available on this machine.*available: cpu"):
        resolve_device(spec)


def test_cuda_index_checked_against_device_count(two_gpus: None) -> None:
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cuda")) == torch.device("cuda", 0)
    with pytest.raises(ConfigError, match=r"'cuda:2'.*index 2 is out of range.*2 cuda device"):
        resolve_device("cuda:2")
    with pytest.raises(ConfigError, match=r"available: cpu, cuda:0, cuda:1"):
        resolve_device("cuda:3")


@pytest.mark.parametrize("spec", ["graphics", "cuda:x", "", "cuda:-1"])
def test_malformed_specs(spec: str) -> None:
    with pytest.raises(ConfigError, match="not a device spec"):
        resolve_device(spec)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        resolve_device("gpu")
    assert issubclass(ConfigError, RLStructError)


def test_mps_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="MPS is not available"):
        resolve_device("mps")


@pytest.mark.parametrize(
    ("device", "expected"),
    [("cpu", False), ("meta", False), (torch.device("cpu"), False), ("cuda", True),
     ("cuda:7", True), (torch.device("cuda", 1), True), ("mps", True), ("xpu", True)],
)
def test_is_accelerator(device: str | torch.device, expected: bool) -> None:
    assert is_accelerator(device) is expected


def test_is_accelerator_auto(no_cuda: None) -> None:
    assert is_accelerator("auto") is False


def test_available_devices(no_cuda: None) -> None:
    devices = available_devices()
    assert devices[0] == torch.device("cpu")
    assert all(resolve_device(d) == d for d in devices)


def test_available_devices_lists_every_gpu(two_gpus: None) -> None:
    devices = available_devices()
    assert devices[:3] == [torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)]


@pytest.mark.gpu
def test_real_gpu() -> None:
    count = torch.cuda.device_count()
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    last = resolve_device(f"cuda:{count - 1}")
    assert torch.zeros(2, device=last).device == last
    assert last in available_devices() and is_accelerator(last)
    with pytest.raises(ConfigError, match="out of range"):
        resolve_device(f"cuda:{count}")

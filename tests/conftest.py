"""Shared fixtures: the devices every container test runs on."""

from __future__ import annotations

import pytest
import torch


def available_devices() -> list[str]:
    """CPU always; CUDA when present."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    return devices


@pytest.fixture(params=available_devices())
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

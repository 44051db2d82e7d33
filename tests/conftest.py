"""Shared fixtures: the devices every container test runs on, and process-leak isolation."""

from __future__ import annotations

import psutil
import pytest
import torch
from processes import children


def available_devices() -> list[str]:
    """CPU always; CUDA when present."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    return devices


@pytest.fixture(params=available_devices())
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


#: Seconds a test's processes get to finish leaving after the test before they count as leaked.
LEAK_GRACE_S = 3.0


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Fails the test that leaves a process behind, and kills it, so the next test starts clean
    (a failing or timed-out test must not fail the tests after it)."""
    yield
    leftovers = children()
    if not leftovers:
        return
    _gone, alive = psutil.wait_procs(leftovers, timeout=LEAK_GRACE_S)
    if not alive:
        return
    described = []
    for proc in alive:
        try:
            described.append(f"{proc.pid} ({' '.join(proc.cmdline())[:80]})")
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5.0)
    pytest.fail(f"the test left processes behind (now killed): {described}", pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

"""Shared fixtures: the devices every container test runs on, process-leak isolation, and the
one registration that sends test code to worker processes and Ray actors by value."""

from __future__ import annotations

# rlstruct first: its first line sets OMP_WAIT_POLICY=PASSIVE before torch loads OpenMP, so
# that these processes' idle threads sleep too (the suite's 3 workers share 2 cores)
import rlstruct  # noqa: F401

# isort: split
from pathlib import Path
from types import ModuleType

import cloudpickle
import psutil
import pytest
import torch
from support import agents, batcher_helpers, fault_envs
from support.processes import children

TESTS = Path(__file__).resolve().parent

#: Helper modules whose agents, envs and factories workers receive: they are pickled by value,
#: since a worker process or a Ray actor cannot import ``tests/``.
HELPERS: tuple[ModuleType, ...] = (agents, batcher_helpers, fault_envs)


def send_by_value(module: ModuleType) -> None:
    """Pickles ``module``'s functions and classes by value (once per module)."""
    if module.__name__ not in cloudpickle.list_registry_pickle_by_value():
        cloudpickle.register_pickle_by_value(module)


for _helper in HELPERS:
    send_by_value(_helper)


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


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test, as in each worker (``n_threads=1``): a replay's or another
    process's matrix products then run the same kernels as the acting ones, bit for bit."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


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


#: Test modules whose tests share one expensive fixture (a cluster, trained runs): under
#: pytest-xdist (``make test`` runs ``-n 2 --dist loadgroup``) each group runs in one worker, so
#: the fixture is made once and two clusters never compete for the same ports and cores. The
#: longest group comes first.
XDIST_GROUPS = {
    "slurm/": "slurm",
    "batchers/test_ray.py": "ray",
    "batchers/test_recurrent_batchers.py": "ray",
    "learners/test_learner_ray.py": "ray",
    "tools/test_policy.py": "trained-policies",
    "tools/test_export.py": "exported-policies",
}


def xdist_group(path: Path) -> str | None:
    """The ``XDIST_GROUPS`` group of the test file at ``path``, if any."""
    relative = path.resolve().relative_to(TESTS).as_posix()
    for prefix, group in XDIST_GROUPS.items():
        if relative == prefix or (prefix.endswith("/") and relative.startswith(prefix)):
            return group
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Sends every collected test module by value (agents and envs defined in a test reach the
    workers), groups the tests that share a cluster (``XDIST_GROUPS``), and skips the ``gpu``
    tests without CUDA."""
    for module in {getattr(item, "module", None) for item in items} - {None}:
        send_by_value(module)
    groups = {}
    for item in items:
        path = Path(str(item.fspath))
        groups[item.nodeid] = xdist_group(path) if TESTS in path.resolve().parents else None
        if groups[item.nodeid] is not None:
            item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    # The groups first, longest first (the order of XDIST_GROUPS): xdist hands out work in this
    # order, so one worker starts the slurm tier while the other takes everything else.
    rank = {group: k for k, group in enumerate(reversed(list(dict.fromkeys(
        XDIST_GROUPS.values()))))}
    items.sort(key=lambda item: -rank.get(groups[item.nodeid], -1))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

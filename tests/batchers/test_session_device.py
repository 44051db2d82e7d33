"""rlstruct.devices.session_device: SLM-Lab's GPU rotation across trials and sessions.

The documented cases come from SLM-Lab's documentation, page "GPU usage: PPO on Pong/Breakout"
(repository kengz/SLM-Lab-doc, file ``using-slm-lab/gpu-usage-ppo-on-pong.md``, section "Using
Multiple GPUs"):

1. "Automatic GPU Rotation": a trial of 4 sessions on a machine with 2 GPUs puts session 0 on
   GPU 0, session 1 on GPU 1, session 2 on GPU 0, session 3 on GPU 1.
2. "Using CUDA_OFFSET": 8 GPUs, two runs (each its own trial 0) of 4 sessions: the first run uses
   GPUs 0, 1, 2, 3; the second, started with ``CUDA_OFFSET=4`` (``--cuda-offset 4``), uses GPUs
   4, 5, 6, 7.
3. The hint after it: within one run of several trials (search, benchmark) the rotation goes on
   across trials by itself, with no offset: with 8 GPUs, trial 0's four sessions take GPUs 0-3
   and trial 1's take GPUs 4-7, the same split as case 2.
"""

from __future__ import annotations

import pytest
import torch

from rlstruct.devices import session_device
from rlstruct.errors import ConfigError


def cuda(i: int) -> torch.device:
    return torch.device("cuda", i)


def test_documented_rotation_4_sessions_on_2_gpus():
    got = [session_device(0, s, sessions_per_trial=4, n_gpus=2) for s in range(4)]
    assert got == [cuda(0), cuda(1), cuda(0), cuda(1)]


def test_documented_cuda_offset_two_runs_on_8_gpus():
    first = [session_device(0, s, 4, n_gpus=8) for s in range(4)]
    second = [session_device(0, s, 4, n_gpus=8, offset=4) for s in range(4)]
    assert first == [cuda(0), cuda(1), cuda(2), cuda(3)]
    assert second == [cuda(4), cuda(5), cuda(6), cuda(7)]


def test_documented_rotation_across_trials_needs_no_offset():
    trials = [[session_device(t, s, 4, n_gpus=8) for s in range(4)] for t in range(2)]
    assert trials == [[cuda(0), cuda(1), cuda(2), cuda(3)], [cuda(4), cuda(5), cuda(6), cuda(7)]]
    # ... and it is the same split as the two separate runs of the CUDA_OFFSET example.
    assert trials[1] == [session_device(0, s, 4, n_gpus=8, offset=4) for s in range(4)]


@pytest.mark.parametrize(
    ("trial", "session", "per_trial", "n_gpus", "offset", "expected"),
    [
        (0, 0, 1, 1, 0, 0),
        (5, 0, 1, 1, 3, 0),  # one GPU: always cuda:0
        (1, 2, 3, 4, 0, 1),  # 1*3 + 2 = 5 -> 5 % 4
        (2, 1, 3, 4, 2, 1),  # 2*3 + 1 + 2 = 9 -> 9 % 4
        (0, 0, 2, 3, 7, 1),  # offset larger than n_gpus wraps
    ],
)
def test_formula(trial, session, per_trial, n_gpus, offset, expected):
    assert session_device(trial, session, per_trial, n_gpus, offset) == cuda(expected)


def test_no_gpu_is_cpu_whatever_the_indices():
    assert session_device(0, 0, 1, 0) == torch.device("cpu")
    assert session_device(7, 3, 4, 0, offset=5) == torch.device("cpu")


def test_pure_no_cuda_call(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("session_device made a CUDA call")

    for name in ("is_available", "device_count", "current_device", "init", "set_device"):
        monkeypatch.setattr(torch.cuda, name, boom)
    assert session_device(1, 1, 2, n_gpus=4) == cuda(3)  # no check that cuda:3 exists
    assert session_device(1, 1, 2, n_gpus=0) == torch.device("cpu")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"trial": -1}, {"session": -1}, {"sessions_per_trial": -2}, {"n_gpus": -1},
        {"offset": -1}, {"sessions_per_trial": 0}, {"session": 4},
    ],
)
def test_bad_values_raise_config_error(kwargs):
    args = {"trial": 0, "session": 0, "sessions_per_trial": 4, "n_gpus": 2, "offset": 0}
    args.update(kwargs)
    with pytest.raises(ConfigError, match="session_device"):
        session_device(**args)


@pytest.mark.parametrize("bad", [1.0, "1", None, True])
def test_non_int_raises_type_error(bad):
    with pytest.raises(TypeError, match="must be an int"):
        session_device(0, 0, 4, bad)

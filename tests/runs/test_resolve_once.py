"""Resolved once (issue 37, item 2): ``resolve`` leaves the config it is given unchanged and
returns a :class:`~rlstruct.runs.resolve.Resolved`; on one PPO start-up each start-up step (the
env probe for the spaces, the checkpoint load of a resume, torchrun's world size, the run's
pipeline check, the resolution of each device spec) runs once in the driver process."""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import rlstruct.devices
import rlstruct.envs.registry
import rlstruct.learners.torchrun
import rlstruct.runs.checkpoint
import rlstruct.runs.resolve
from rlstruct.algos import ppo
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import Resolved, resolve, run_cli


def small(tmp_path: Path, **overrides: Any) -> ppo.Config:
    """A PPO run of one or two iterations on CartPole, collected in this process."""
    fields: dict[str, Any] = dict(
        runs_dir=str(tmp_path / "runs"), max_frames=64, target_return=None, eval_every=1,
        checkpoint_every=1, n_timesteps=16, minibatch_size=32, n_epochs=1,
        layout=LayoutConfig(n_processes=1, n_envs=2))
    return ppo.Config(**{**fields, **overrides})


def checkpointed_run(tmp_path: Path) -> Path:
    """The folder of a finished PPO run with a checkpoint."""
    summary = ppo.main(small(tmp_path, eval_every=0))
    assert summary["checkpoint"] is not None
    return Path(summary["run_dir"])


def test_resolve_leaves_its_argument_unchanged_with_resume_auto_and_a_layout_file(tmp_path):
    first = checkpointed_run(tmp_path)
    layout = tmp_path / "tune.json"
    layout.write_text(json.dumps({"n_processes": 1, "n_envs": 4}))
    cfg = small(tmp_path, resume="auto", layout_file=str(layout), max_frames=128)
    before, fields_before = copy.deepcopy(cfg), dataclasses.asdict(cfg)
    resolved = resolve(cfg)
    assert dataclasses.asdict(cfg) == fields_before and cfg == before
    assert cfg.resume == "auto" and cfg.layout.n_envs == 2
    assert vars(cfg).keys() == vars(before).keys()  # no hidden marker
    assert resolved.cfg is not cfg and resolved.cfg.layout is not cfg.layout
    assert resolved.cfg.resume == str(first) and resolved.cfg.layout.n_envs == 4
    assert resolved.checkpoint is not None and resolved.checkpoint["frames"] == 64
    assert resolved.obs_shape == (4,) and resolved.action_space.n == 2
    assert resolved.learner_device == resolved.batcher_device == torch.device("cpu")
    assert resolved.world_size == 1 and resolved.algo == "ppo"
    assert resolve(resolved) is resolved
    assert resolved.n_timesteps == resolved.cfg.n_timesteps == 16 and resolved.layout.n_envs == 4
    assert copy.deepcopy(resolved).cfg == resolved.cfg  # a config field reads through
    with pytest.raises(AttributeError):
        resolved.no_such_field  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.world_size = 2  # type: ignore[misc]


def test_resolve_leaves_a_fresh_config_unchanged(tmp_path):
    cfg = small(tmp_path, resume="auto")  # no checkpointed run: a fresh run
    before = dataclasses.asdict(cfg)
    resolved = resolve(cfg)
    assert dataclasses.asdict(cfg) == before and cfg.resume == "auto"
    assert resolved.cfg.resume is None and resolved.checkpoint is None


#: Each start-up step: (the module that defines it, its name, which calls count).
STEPS: dict[str, tuple[Any, str, Callable[..., bool]]] = {
    "env probe": (rlstruct.envs.registry, "probe_spaces", lambda *a, **k: True),
    "checkpoint load": (rlstruct.runs.checkpoint, "load_checkpoint",
                        lambda path, *a, **k: Path(path).name == "latest.pt"),
    "world size": (rlstruct.learners.torchrun, "torchrun_world", lambda *a, **k: True),
    "pipeline check": (rlstruct.runs.resolve, "pipeline_problems", lambda *a, **k: True),
    "device resolution": (rlstruct.devices, "resolve_device",
                          lambda spec, *a, **k: isinstance(spec, str)),
}


def count_steps(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple[Any, ...]]]:
    """Wraps each step's function in every rlstruct module that holds it (where it is looked
    up), and returns the arguments of the counted calls by step."""
    calls: dict[str, list[tuple[Any, ...]]] = {step: [] for step in STEPS}
    for step, (home, name, counts) in STEPS.items():
        original = getattr(home, name)

        def counted(*args: Any, _step: str = step, _original: Any = original,
                    _counts: Callable[..., bool] = counts, **kwargs: Any) -> Any:
            if _counts(*args, **kwargs):
                calls[_step].append(args)
            return _original(*args, **kwargs)

        holders = [m for n, m in list(sys.modules.items())
                   if n.startswith("rlstruct") and getattr(m, name, None) is original]
        assert home in holders
        for module in holders:
            monkeypatch.setattr(module, name, counted)
    return calls


def assert_once(calls: dict[str, list[tuple[Any, ...]]], resumed: bool) -> None:
    specs = collections.Counter(args[0] for args in calls.pop("device resolution"))
    assert specs and all(n == 1 for n in specs.values()), specs  # each device spec once
    loads = calls.pop("checkpoint load")
    assert len(loads) == (1 if resumed else 0), loads
    for step, seen in calls.items():
        assert len(seen) == 1, (step, seen)


@pytest.mark.parametrize("how", ["main", "command line"])
def test_each_start_up_step_runs_once_for_a_fresh_and_a_resumed_run(how, tmp_path, monkeypatch):
    def start(**overrides: Any) -> dict[str, Any]:
        cfg = small(tmp_path, **overrides)
        if how == "main":
            return ppo.main(cfg)
        args = ["--runs-dir", cfg.runs_dir, "--max-frames", str(cfg.max_frames),
                "--target-return", "None",
                "--eval-every", "1", "--checkpoint-every", "1", "--n-timesteps", "16",
                "--minibatch-size", "32", "--n-epochs", "1", "--n-processes", "1",
                "--n-envs", "2", *(["--resume", overrides["resume"]] if "resume" in overrides
                                   else [])]
        return run_cli(ppo.main, ppo.Config, args=args, prog="test")

    with monkeypatch.context() as patched:
        calls = count_steps(patched)
        fresh = start()
        assert_once(calls, resumed=False)
    assert fresh["status"] in ("budget", "ended") and fresh["checkpoint"] is not None
    with monkeypatch.context() as patched:
        calls = count_steps(patched)
        resumed = start(resume="auto", max_frames=128)
        assert_once(calls, resumed=True)
    assert resumed["resumes"] == 1 and resumed["run_dir"] == fresh["run_dir"]
    assert resumed["frames"] > fresh["frames"]


def test_run_takes_a_resolved_config_as_it_is(tmp_path, monkeypatch):
    resolved = resolve(small(tmp_path))
    with monkeypatch.context() as patched:
        calls = count_steps(patched)
        summary = ppo.main(resolved)
    assert all(not seen for seen in calls.values()), calls  # nothing resolved again
    assert summary["frames"] >= 64 and isinstance(resolved, Resolved)


def test_a_main_written_for_a_config_reads_its_fields_on_what_run_cli_hands_it(tmp_path):
    def main(cfg: Any) -> tuple[Any, ...]:  # a user's loop: ``Run(name, cfg)``, then ``cfg.lr``
        return type(cfg), cfg.n_timesteps, cfg.layout.n_envs, cfg.cfg.runs_dir

    kind, n_timesteps, n_envs, runs_dir = run_cli(
        main, ppo.Config, args=["--n-timesteps", "8", "--n-envs", "3", "--runs-dir",
                                str(tmp_path)], prog="test")
    assert (kind, n_timesteps, n_envs, runs_dir) == (Resolved, 8, 3, str(tmp_path))

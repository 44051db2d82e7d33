"""Experiment tracking with wandb (issue 42, item 5): ``--wandb`` mirrors a run into a wandb run
(rows with frames as the step, config.json, the plots, an evaluation's video), a wandb error is
one warning and never the run's, and a missing wandb is refused before any folder exists.

The real runs use ``WANDB_MODE=offline`` (no network) and read the offline run back from its
``.wandb`` file; the tests of the guards use a stand-in ``wandb`` module."""

from __future__ import annotations

import csv
import json
import sys
import threading
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlstruct.algos import ppo
from rlstruct.errors import ConfigError
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.tracking import (
    WANDB_FILE,
    TrackingOptions,
    WandbTracker,
    log_videos,
    run_tags,
    tracking_options,
    tracking_problems,
)


def small(tmp_path: Path, **overrides: Any) -> ppo.Config:
    """A PPO run of two iterations on CartPole with --wandb, collected in this process."""
    fields: dict[str, Any] = dict(
        runs_dir=str(tmp_path / "runs"), max_frames=64, target_return=None, eval_every=0,
        checkpoint_every=1, n_timesteps=16, minibatch_size=32, n_epochs=1, wandb=True,
        layout=LayoutConfig(n_processes=1, n_envs=2))
    return ppo.Config(**{**fields, **overrides})


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The real wandb, offline, writing under ``tmp_path/wandb_home``; its service process is
    torn down after the test."""
    wandb = pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[wandb]'")
    home = tmp_path / "wandb_home"
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(home))
    home.mkdir()
    yield wandb
    wandb.teardown()


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of a ``.wandb`` file (a LevelDB-style log of protobuf records: a 7-byte
    header, then 32 KiB blocks of chunks, each with a 7-byte header: crc, length, kind)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, chunk, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def offline_run(home: Path) -> dict[str, Any]:
    """The one offline run under ``home``: its run record, config and history rows."""
    (path,) = home.glob("wandb/offline-run-*/run-*.wandb")
    out: dict[str, Any] = {"run": None, "config": {}, "history": []}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                   for i in record.history.item})
    return out


def test_a_tracked_run_logs_its_rows_config_and_plots(offline_wandb, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = ppo.main(small(tmp_path, wandb_group="sweep-1", preset="mujoco"))
    assert not [w for w in caught if "wandb" in str(w.message)], [str(w.message) for w in caught]
    run_dir = Path(summary["run_dir"])
    logged = offline_run(tmp_path / "wandb_home")
    run = logged["run"]
    assert (run.project, run.run_group, run.display_name) == ("rlstruct", "sweep-1", run_dir.name)
    assert list(run.tags) == ["ppo", "CartPole-v1", "mujoco"]
    assert json.loads((run_dir / WANDB_FILE).read_text())["id"] == run.run_id
    config = json.loads((run_dir / "config.json").read_text())
    assert logged["config"]["config"] == config["config"]
    assert logged["config"]["algo"] == "ppo" and logged["config"]["config"]["wandb"] is True
    with open(run_dir / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 2
    history = [h for h in logged["history"] if "loss" in h or "iteration" in h]
    assert [h["frames"] for h in history] == [int(r["frames"]) for r in rows]
    assert history[0]["train_return_mean20"] == pytest.approx(float(rows[0]["train_return_mean20"]))
    plots = [(h["returns/_type"], h["frames"]) for h in logged["history"] if "returns/_type" in h]
    drawn = (run_dir / "returns.png").is_file()  # with matplotlib
    assert plots == ([("image-file", summary["frames"])] if drawn else [])
    images = (tmp_path / "wandb_home").glob("wandb/offline-run-*/files/media/images/returns*.png")
    assert len(list(images)) == drawn


def test_a_wandb_init_that_raises_is_one_warning_and_the_run_finishes(
        offline_wandb, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("no network here")

    monkeypatch.setattr(offline_wandb, "init", refuse)
    with pytest.warns(UserWarning, match="wandb init failed: RuntimeError: no network here; "
                      "the run goes on without wandb") as caught:
        summary = ppo.main(small(tmp_path))
    assert len([w for w in caught if "wandb" in str(w.message)]) == 1
    assert summary["stopped_by"] == "max_frames" and summary["frames"] >= 64
    assert (Path(summary["run_dir"]) / "progress.csv").is_file()
    assert not (Path(summary["run_dir"]) / WANDB_FILE).exists()


def test_wandb_missing_is_refused_before_any_run_folder(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    assert tracking_problems(ppo.Config()) == []  # without --wandb, wandb is not needed
    with pytest.raises(ConfigError, match=r"--wandb needs wandb.*pip install -e '\.\[wandb\]'"):
        ppo.main(small(tmp_path))
    assert not (tmp_path / "runs").exists()


def test_an_empty_wandb_project_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="wandb_project must be a wandb project name"):
        ppo.main(small(tmp_path, wandb_project=""))
    assert not (tmp_path / "runs").exists()


def test_tags_and_options_follow_the_config():
    assert tracking_options("ppo", ppo.Config()) is None  # off by default
    cfg = ppo.Config(wandb=True, wandb_project="p", env_id="Acrobot-v1", preset="mujoco")
    assert tracking_options("ppo", cfg) == TrackingOptions("p", None,
                                                           ("ppo", "Acrobot-v1", "mujoco"))
    assert run_tags("dqn", ppo.Config()) == ("dqn", "CartPole-v1")


# ------------------------------------------------------------ the guards, on a stand-in wandb
class FakeRun:
    """A wandb run that records its calls; ``fail_log_at`` makes that log call raise."""

    def __init__(self, fail_log_at: int | None = None, finish_blocks: bool = False) -> None:
        self.logged: list[dict[str, Any]] = []
        self.config = types.SimpleNamespace(update=lambda values, allow_val_change: None)
        self.finished = threading.Event()
        self.release = threading.Event()
        self.fail_log_at, self.finish_blocks = fail_log_at, finish_blocks

    def define_metric(self, name: str, step_metric: str | None = None) -> None:
        pass

    def log(self, values: dict[str, Any]) -> None:
        if self.fail_log_at == len(self.logged):
            raise OSError("disk full")
        self.logged.append(values)

    def finish(self) -> None:
        if self.finish_blocks:
            self.release.wait(10)
        self.finished.set()


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A stand-in ``wandb`` module: ``init`` returns ``module.run`` and records its kwargs."""
    module = types.SimpleNamespace(run=FakeRun(), inits=[], Settings=dict,
                                   Image=lambda path: ("image", path),
                                   Video=lambda path: ("video", path))

    def init(**kwargs: Any) -> FakeRun:
        module.inits.append(kwargs)
        return module.run

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


OPTIONS = TrackingOptions("proj", "grp", ("ppo", "CartPole-v1"))


def test_a_failing_log_is_one_warning_and_turns_tracking_off(fake_wandb, tmp_path):
    fake_wandb.run = FakeRun(fail_log_at=1)
    tracker = WandbTracker(OPTIONS, tmp_path, {"algo": "ppo"})
    tracker.log({"frames": 10, "loss": 0.5, "eval_return": float("nan")})
    with pytest.warns(UserWarning, match="wandb log failed: OSError: disk full") as caught:
        for frames in (20, 30, 40):
            tracker.log({"frames": frames, "loss": 0.25})
    assert len(caught) == 1 and not tracker.active
    assert fake_wandb.run.logged == [{"frames": 10, "loss": 0.5}]  # nan is no value
    tracker.finish()
    assert fake_wandb.run.finished.is_set()  # finished all the same


def test_finish_is_bounded(fake_wandb, tmp_path):
    fake_wandb.run = FakeRun(finish_blocks=True)
    tracker = WandbTracker(OPTIONS, tmp_path, {})
    with pytest.warns(UserWarning, match="wandb finish did not end within 0 s"):
        tracker.finish(timeout=0.05)
    fake_wandb.run.release.set()
    assert fake_wandb.run.finished.wait(5)


def test_a_resumed_run_continues_its_wandb_run_and_gets_the_video(fake_wandb, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"algo": "ppo"}))
    WandbTracker(OPTIONS, tmp_path, {}).finish()
    WandbTracker(OPTIONS, tmp_path, {}).finish()  # a resume: the same folder
    video = tmp_path / "rl-video-episode-0.mp4"
    assert log_videos(tmp_path, [video], frames=640)
    first, again, evaluation = fake_wandb.inits
    assert first["id"] == again["id"] == evaluation["id"]
    assert (first["project"], first["group"], first["tags"]) == ("proj", "grp",
                                                                 ["ppo", "CartPole-v1"])
    assert (evaluation["project"], evaluation["group"]) == ("proj", "grp")
    assert fake_wandb.run.logged[-1] == {"frames": 640, "eval_video": ("video", str(video))}
    assert not log_videos(tmp_path / "elsewhere", [video], frames=640)  # an untracked run


def test_the_logger_sends_its_rows_and_finishes_the_run_on_ctrl_c(fake_wandb, tmp_path):
    from rlstruct.runs.logger import RunLogger

    with pytest.raises(KeyboardInterrupt), RunLogger(
            "ppo", "CartPole-v1", {"lr": 0.1}, tmp_path, progress=False, tensorboard=False,
            tracking=OPTIONS) as logger:
        logger.record_episodes([10.0, 20.0])
        logger.log(frames=128, loss=0.5)
        logger.log(frames=256, loss=0.25, eval_return=float("nan"))
        raise KeyboardInterrupt
    run = fake_wandb.run
    assert [(r["frames"], r["loss"], r["train_return_mean20"]) for r in run.logged[:2]] == [
        (128, 0.5, 15.0), (256, 0.25, 15.0)]
    assert "eval_return" not in run.logged[1]
    assert run.finished.is_set()
    (init,) = fake_wandb.inits
    assert init["name"] == logger.dir.name
    returns = logger.folder.returns_plot  # drawn when matplotlib is installed
    assert run.logged[2:] == ([{"frames": 256, "returns": ("image", str(returns))}]
                              if returns.is_file() else [])


def test_rlstruct_evaluate_sends_its_video_to_the_runs_wandb_run(fake_wandb, tmp_path, capsys,
                                                                 monkeypatch):
    import rlstruct.tools.evaluate
    from rlstruct.__main__ import main

    def evaluate(run_dir, checkpoint, episodes, device, seed, video_dir):  # moviepy's part
        Path(video_dir).mkdir()
        (Path(video_dir) / "rl-video-episode-0.mp4").write_bytes(b"\0" * 64)
        return [9.0], {"algo": "ppo", "frames": 512, "config": {"env_id": "CartPole-v1"}}

    monkeypatch.setattr(rlstruct.tools.evaluate, "evaluate", evaluate)
    WandbTracker(OPTIONS, tmp_path, {}).finish()  # the training run, tracked
    assert main(["evaluate", str(tmp_path), "--video", str(tmp_path / "v")]) == 0
    assert "video logged to the run's wandb run" in capsys.readouterr().out
    video = tmp_path / "v" / "rl-video-episode-0.mp4"
    assert fake_wandb.run.logged[-1] == {"frames": 512, "eval_video": ("video", str(video))}
    assert fake_wandb.inits[0]["id"] == fake_wandb.inits[1]["id"]

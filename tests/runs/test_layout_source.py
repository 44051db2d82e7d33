"""config.json records where the run's layout came from: default, preset, flags or a file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rlstruct.runs.config import RunConfig, layout_source, session_record
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.layout_file import write_layout
from rlstruct.runs.presets import Preset
from rlstruct.runs.run import Run
from rlstruct.tools.tune import Candidate, tuned_layout


@dataclass
class Cfg(RunConfig):
    """A config with presets."""

    presets: ClassVar[dict[str, Preset]] = {
        "small": Preset("fewer envs", dict(n_envs=4, lr=0.01)),
        "fast": Preset("a larger lr only", dict(lr=0.01)),
    }


def test_the_layout_source_of_each_way_to_set_the_layout(tmp_path):
    assert layout_source(Cfg()) == "default"
    assert layout_source(Cfg(layout=LayoutConfig(n_envs=4))) == "flags"
    assert layout_source(Cfg.from_preset("small")) == "preset"
    assert layout_source(Cfg.from_preset("small", n_envs=16)) == "flags"  # a flag over it
    assert layout_source(Cfg.from_preset("fast")) == "default"  # the preset sets no layout
    assert layout_source(Cfg(layout_file=str(tmp_path / "tune.json"))) == "file"
    record = session_record(Cfg.from_preset("small"), 0, {"launcher": "rlstruct"})
    assert record["layout_source"] == "preset"


def test_config_json_records_the_layout_and_its_source(tmp_path):
    path = write_layout(tmp_path / "tune.json", tuned_layout(Candidate(1, 3, 5, n_threads=2)))
    cfg = RunConfig(env_id="CartPole-v1", eval_every=0, runs_dir=str(tmp_path / "runs"),
                    layout_file=str(path), layout=LayoutConfig(learner_device="cpu"))
    with Run("test", cfg) as run:
        run_dir = Path(run.logger.dir)
    meta = json.loads((run_dir / "config.json").read_text())
    assert meta["sessions"][0]["layout_source"] == "file"
    config = meta["config"]
    assert config["layout_file"] == str(path)
    assert (config["layout"]["n_processes"], config["layout"]["n_envs"]) == (1, 3)
    assert (config["n_timesteps"], config["n_threads"]) == (5, 2)  # the file's, applied

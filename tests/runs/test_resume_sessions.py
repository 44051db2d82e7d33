"""What a resumed run says of itself (issue 38, items 2, 13 and 21): a resumed run stopped by its
budget is not "solved" by a solve its checkpoint recorded, ``--resume auto`` picks the newest run
of this algorithm and env (and says which), and config.json records every session.

The runs are test_run.py's: a fixed agent on ``rlstruct/Repeat-v0`` in one process.
"""

from __future__ import annotations

import json
import os

from test_run import config, train

from rlstruct.runs.resolve import resolve


def test_a_resume_stopped_by_its_budget_is_not_solved_by_the_solve_before_it(tmp_path, capsys):
    first = train(config(tmp_path, target_return=10.0, target_window=4))
    assert first.summary["solved"] and first.summary["frames_to_solve"] == 40
    capsys.readouterr()
    # Resumed without a target (a budget may change): it stops by max_frames, never "solved".
    again = train(config(tmp_path, target_return=None, target_window=4, max_frames=80,
                         resume=str(first.logger.dir)))
    s = again.summary
    assert s["stopped_by"] == "max_frames" and s["status"] == "budget" and s["frames"] == 80
    assert not s["solved"] and s["frames_to_solve"] is None and s["time_to_solve"] is None
    out = capsys.readouterr().out
    assert "test: stopped by max_frames after 80 frames" in out and "solved" not in out
    on_disk = json.loads((first.logger.dir / "summary.json").read_text())
    assert (on_disk["solved"], on_disk["status"], on_disk["frames_to_solve"]) == (
        False, "budget", None)
    # Resumed with the target again, it is solved by its own stop test, at its own frames.
    third = train(config(tmp_path, target_return=10.0, target_window=4, max_frames=400,
                         resume=str(first.logger.dir)))
    s = third.summary
    assert s["solved"] and s["stopped_by"] == "target_return"
    assert s["frames_to_solve"] == s["frames"] > 80
    assert f"test: solved after {s['frames']} frames" in capsys.readouterr().out


def test_resume_auto_picks_the_newest_run_of_this_algorithm_and_env_and_says_which(
    tmp_path, capsys
):
    ours = train(config(tmp_path, target_return=None, max_frames=20)).logger.dir
    # Newer runs of another algorithm and of another env in the same --runs-dir.
    other_algo = train(config(tmp_path, target_return=None, max_frames=20)).logger.dir
    meta = json.loads((other_algo / "config.json").read_text())
    (other_algo / "config.json").write_text(json.dumps({**meta, "algo": "ppo"}))
    other_env = train(config(tmp_path, target_return=None, max_frames=20)).logger.dir
    meta = json.loads((other_env / "config.json").read_text())
    (other_env / "config.json").write_text(json.dumps({**meta, "env": "CartPole-v1"}))
    now = (ours / "checkpoints" / "latest.pt").stat().st_mtime
    for newer, dt in ((other_algo, 10), (other_env, 20)):
        os.utime(newer / "checkpoints" / "latest.pt", (now + dt, now + dt))
    capsys.readouterr()
    resolved = resolve(config(tmp_path, target_return=None, max_frames=40, resume="auto"), "test")
    assert resolved.cfg.resume == str(ours) and resolved.checkpoint is not None
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rlstruct: --resume auto: resuming {ours}, the newest test run on "
                   "rlstruct/Repeat-v0 with a checkpoint"]
    # No run of this algorithm and env holds a checkpoint: a new run, and the line says so.
    (ours / "checkpoints" / "latest.pt").unlink()
    resolved = resolve(config(tmp_path, target_return=None, max_frames=40, resume="auto"), "test")
    assert resolved.cfg.resume is None and resolved.checkpoint is None
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rlstruct: --resume auto: no test run on rlstruct/Repeat-v0 in "
                   f"{tmp_path / 'runs'} has a checkpoint: starting a new run"]


def test_config_json_records_every_sessions_argv_frames_and_budgets(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["train", "--max-frames", "40"])
    run_dir = train(config(tmp_path, target_return=None, max_frames=40)).logger.dir
    monkeypatch.setattr("sys.argv", ["train", "--max-frames", "80", "--target-return", "9"])
    train(config(tmp_path, target_return=9.5, max_frames=80, resume=str(run_dir)))
    meta = json.loads((run_dir / "config.json").read_text())
    first, second = meta["sessions"]
    assert first["argv"] == ["train", "--max-frames", "40"] and first["frames"] == 0
    assert first["settings"]["max_frames"] == 40 and first["settings"]["target_return"] is None
    assert second["argv"][-1] == "9" and second["frames"] == 40
    assert second["settings"]["max_frames"] == 80 and second["settings"]["target_return"] == 9.5
    assert second["settings"]["resume"] == str(run_dir) and first["settings"]["resume"] is None
    assert meta["config"]["max_frames"] == 40  # the first session's whole config, as before

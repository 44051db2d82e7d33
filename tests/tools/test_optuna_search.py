"""rlstruct sweep --search optuna: the space file, the study, resume, the pruner, the outputs.

Fast tests drive a fake algorithm (a module written to tmp_path, put on PYTHONPATH, that writes
a run folder row by row as Run does; its train return grows with --lr) under the name ``ppo``,
so that the space is checked against PPO's Config; the slow test searches the real PPO.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import signal
import sqlite3
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna", reason="the optuna extra: pip install -e '.[optuna]'")

import tyro  # noqa: E402

from rlstruct.algos.ppo import Config  # noqa: E402
from rlstruct.errors import ConfigError  # noqa: E402
from rlstruct.parallel.startup import Terminated  # noqa: E402
from rlstruct.tools.optuna_search import optuna_search  # noqa: E402
from rlstruct.tools.optuna_space import parse_space, read_space  # noqa: E402
from rlstruct.tools.optuna_study import STUDY_COLUMNS, objective_value  # noqa: E402
from rlstruct.tools.session_curve import SessionCurve, read_curve  # noqa: E402
from rlstruct.tools.sessions import SessionResult  # noqa: E402
from rlstruct.tools.sweep import main  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

FAKE_ALGO = textwrap.dedent('''
    """A fake algorithm: a run folder written row by row (100 frames each, FAKE_ROW_S seconds
    apart), train return lr * 1000 * row; solved at return >= 30; SIGTERM: status interrupted."""
    import argparse, json, os, signal, sys, time
    from pathlib import Path

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int)
    p.add_argument("--runs-dir")
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--max-frames", type=int, default=500)
    a, _ = p.parse_known_args()
    run = Path(a.runs_dir) / "fake_run"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"config": {"seed": a.seed}}))
    (run / "pid").write_text(str(os.getpid()))
    summary = {"status": "budget", "frames": 0, "wall_time": 0.0, "frames_to_solve": None,
               "time_to_solve": None, "train_return_mean2": None}

    def stop(signum, frame):
        (run / "summary.json").write_text(json.dumps(dict(summary, status="interrupted")))
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    start = time.monotonic()
    with open(run / "progress.csv", "w") as f:
        f.write("frames,train_return_mean2,lr\\n")
        for i in range(1, a.max_frames // 100 + 1):
            time.sleep(float(os.environ.get("FAKE_ROW_S", "0.02")))
            ret = a.lr * 1000 * i
            f.write(f"{100 * i},{ret},{a.lr}\\n")
            f.flush()
            summary.update(frames=100 * i, wall_time=time.monotonic() - start,
                           train_return_mean2=ret)
            if ret >= 30:
                summary.update(status="solved", frames_to_solve=100 * i,
                               time_to_solve=summary["wall_time"])
                break
    (run / "summary.json").write_text(json.dumps(summary))
''')


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Runs the fake algorithm as the sessions' module; returns the search's common kwargs."""
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "fake_optuna_algo.py").write_text(FAKE_ALGO)
    monkeypatch.setenv("PYTHONPATH", str(pkg))
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"lr": {"low": 1e-4, "high": 1e-1, "log": True}}))
    return {"algo": "ppo", "module": "fake_optuna_algo", "space": space, "seeds": [0],
            "max_parallel": 2, "report_every": 100, "poll_s": 0.05, "quiet": True,
            "algo_args": ["--max-frames", "500"]}


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and tuple(rows[0]) == STUDY_COLUMNS
    return rows


# ------------------------------------------------------------------------------ the space file
def test_the_space_file_draws_by_the_fields_types(tmp_path):
    path = tmp_path / "space.json"
    path.write_text(json.dumps({
        "lr": {"low": 1e-4, "high": 1e-2, "log": True}, "n-epochs": {"low": 2, "high": 8},
        "n_timesteps": {"low": 16, "high": 64, "step": 16},
        "gae_lambda": {"low": 0.8, "high": 0.99, "type": "float"},
        "adv_norm": {"choices": ["minibatch", "batch"]},
        "value_clip": {"choices": [None, 0.2]}, "anneal_lr": {"choices": [True, False]},
        "n_envs": {"low": 2, "high": 8}}))  # a field of the layout, flattened as its flag
    space = read_space(path, Config)
    assert {n: p.kind for n, p in space.items()} == {
        "lr": "float", "n_epochs": "int", "n_timesteps": "int", "gae_lambda": "float",
        "adv_norm": "choices", "value_clip": "choices", "anneal_lr": "choices", "n_envs": "int"}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(5):
        trial = study.ask()
        drawn = {n: p.suggest(trial) for n, p in space.items()}
        assert 1e-4 <= drawn["lr"] <= 1e-2 and isinstance(drawn["n_epochs"], int)
        assert drawn["n_timesteps"] in (16, 32, 48, 64)
        assert drawn["adv_norm"] in ("minibatch", "batch")
        study.tell(trial, 0.0)


@pytest.mark.parametrize(("entry", "message"), [
    ({"lrr": {"low": 0.1, "high": 1}}, r"'lrr': Config has no such field \(did you mean 'lr'"),
    ({"seed": {"low": 0, "high": 9}}, r"entry 'seed': the sweep sets seed"),
    ({"lr": {"low": 0.0, "high": 1.0, "log": True}}, r"entry 'lr': log needs low > 0"),
    ({"lr": {"low": 0.5, "high": 0.1}}, r"entry 'lr': low \(0.5\) must be <= high"),
    ({"n_epochs": {"low": 1.5, "high": 4}}, r"entry 'n_epochs': low must be an integer"),
    ({"n_epochs": {"low": 1, "high": 4, "type": "float"}}, r"entry 'n_epochs': type 'float'"),
    ({"lr": {"low": 1e-3, "high": 1e-2, "log": True, "step": 1e-3}}, r"log and step"),
    ({"lr": {"low": 1e-3}}, r"entry 'lr': a range has low and high"),
    ({"lr": {"low": 1e-3, "high": 1, "scale": 2}}, r"got keys \['high', 'low', 'scale'\]"),
    ({"model": {"low": 0, "high": 2}}, r"entry 'model': the field is one of .*give choices"),
    ({"adv_norm": {"choices": ["minibatch", "median"]}}, r"choice \"median\" is not a value"),
    ({"anneal_lr": {"choices": [1, 0]}}, r"choice 1 is not a value of the field \(bool\)"),
    ({"lr": {"choices": []}}, r"choices must be a non-empty list"),
    ({"lr": {"choices": [0.1, 0.1]}}, r"choices must be distinct"),
    ({"lr": {"choices": [[0.1]]}}, r"not a JSON scalar"),
    ({"lr": 0.001}, r"entry 'lr': expected an object"),
    ([], r"expected a non-empty JSON object"),
])
def test_a_bad_space_entry_is_a_config_error_naming_it(entry, message):
    with pytest.raises(ConfigError, match=message):
        parse_space(entry, Config)


def test_every_bad_entry_is_named_at_once_and_bad_json_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"'lrr'.*'n_epochs'"):
        parse_space({"lrr": {"low": 0, "high": 1}, "n_epochs": {"low": 4, "high": 1}}, Config)
    path = tmp_path / "space.json"
    path.write_text('{"lr": {"low": 0.1,}}')
    with pytest.raises(ConfigError, match=rf"space file {path}: not JSON"):
        read_space(path, Config)
    with pytest.raises(ConfigError, match="cannot read it"):
        read_space(tmp_path / "missing.json", Config)


def test_the_command_refuses_a_bad_search_before_any_folder_exists(tmp_path, capsys):
    space, good = tmp_path / "space.json", tmp_path / "good.json"
    space.write_text(json.dumps({"lr": {"low": 1e-4, "high": 1e-2}, "n_epoch": {"low": 1,
                                                                               "high": 4}}))
    good.write_text(json.dumps({"lr": {"low": 1e-4, "high": 1e-2}}))
    out = tmp_path / "out"
    cases = [
        (["--space", str(space), "--trials", "3"], "unknown flag", "'n_epoch': Config has no"),
        (["--trials", "3"], "no space", "needs --space FILE"),
        (["--space", str(space), "--trials", "[{}]"], "trials", "--trials N, a number"),
        (["--space", str(space), "--trials", "2", "--launcher", "slurm"], "slurm", "one search"),
        (["--space", str(good), "--trials", "0"], "no trials", "--trials must be >= 1"),
        (["--space", str(good), "--trials", "2", "--objective", "speed"], "objective", "speed"),
    ]
    for flags, what, message in cases:
        with pytest.raises(SystemExit) as stop:
            main(["ppo", "--search", "optuna", "--out", str(out), *flags])
        assert stop.value.code == 2, what
        assert message in capsys.readouterr().err, what
        assert not out.exists(), what
    with pytest.raises(SystemExit):
        main(["ppo", "--space", str(space), "--out", str(out)])  # --space without optuna
    assert "--space is the search space of --search optuna" in capsys.readouterr().err


def test_without_optuna_the_search_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    with pytest.raises(ConfigError, match=r"needs optuna \(the 'optuna' extra\).*\[optuna\]"):
        optuna_search("ppo", tmp_path / "space.json", 1, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ progress, objective
def test_the_curve_follows_a_growing_progress_file(tmp_path):
    run = tmp_path / "session0" / "run"
    curve = SessionCurve(tmp_path / "session0")
    curve.update()
    assert curve.frames == 0 and math.isnan(curve.value_at(100))  # no run folder yet
    run.mkdir(parents=True)
    (run / "progress.csv").write_text("frames,wall_time,train_return_mean20\n100,1.0,nan\n"
                                      "200,2.0,5.0\n30")  # the last row half written
    curve.update()
    assert curve.frames == 200 and curve.value_at(150) != curve.value_at(150)  # nan
    assert curve.value_at(250) == 5.0
    with open(run / "progress.csv", "a") as f:
        f.write("0,3.0,7.5\n")
    curve.update()
    assert curve.frames == 300 and curve.value_at(300) == 7.5
    assert read_curve(tmp_path / "missing.csv") == []


def test_the_objective_penalises_unsolved_runs_and_fails_on_a_failed_session():
    def session(**kw):
        return SessionResult(0, kw.pop("s", 0), 0, "default", returncode=0, **kw)

    solved = session(status="solved", solved=True, frames_to_solve=300.0, time_to_solve=2.0,
                     frames=300.0, wall_time=2.0, final_train_return=40.0)
    unsolved = session(s=1, status="budget", frames=500.0, wall_time=3.0,
                       final_train_return=10.0)
    assert objective_value([solved, unsolved], "frames_to_solve") == (650.0, "")
    assert objective_value([solved, unsolved], "time_to_solve") == (4.0, "")
    assert objective_value([solved, unsolved], "final_return") == (25.0, "")
    value, why = objective_value([solved], "eval_return")
    assert value is None and "no eval_return" in why and "--eval-every" in why
    failed = session(s=1, error="exit status 2: bad flag")
    value, why = objective_value([solved, failed], "frames_to_solve")
    assert value is None and why.startswith("session 1 failed: exit status 2")


# ------------------------------------------------------------------------------ the study
def test_a_study_writes_its_outputs_and_resumes(fake, tmp_path):
    out = tmp_path / "search"
    result = optuna_search(n_trials=3, out=out, prune=False, **fake)
    assert result.failed == 0 and len(result.results) == 3
    with sqlite3.connect(out / "study.db") as db:
        ((name,),) = db.execute("SELECT study_name FROM studies").fetchall()
    assert name == "ppo-optuna"
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    rows = read_rows(out / "summary.csv")
    assert [r["trial"] for r in rows] == ["0", "1", "2"]
    for row, trial in zip(rows, study.trials):
        lr = json.loads(row["overrides"])["lr"]
        assert lr == trial.params["lr"]
        rows_to_solve = math.ceil(30 / (lr * 1000) - 1e-9)  # the first row returning >= 30
        expected = 100 * rows_to_solve if rows_to_solve <= 5 else 2 * 500.0  # unsolved: 2x
        assert float(row["value"]) == expected
    best = json.loads((out / "best.json").read_text())
    assert best["value"] == min(t.value for t in study.trials) == result.best["value"]
    assert best["params"] == study.best_trial.params and best["trials"]["complete"] == 3
    words = shlex.split(best["command"])
    assert words[:3] == ["rlstruct", "train", "ppo"]
    cfg = tyro.cli(Config, args=words[3:])  # the train line parses with PPO's Config
    assert cfg.lr == best["params"]["lr"] and cfg.max_frames == 500
    assert (out / "optuna_history.png").stat().st_size > 0
    assert (out / "optuna_importances.png").stat().st_size > 0

    again = optuna_search(n_trials=4, out=out, prune=False, **fake)  # resumed: one more trial
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'study.db'}")
    assert len(study.trials) == 4 and [r.trial for r in again.results] == [3]
    assert [r["trial"] for r in read_rows(out / "summary.csv")] == ["0", "1", "2", "3"]
    assert (out / "trial3" / "session0").is_dir()
    with pytest.raises(ConfigError, match="was made with objective 'frames_to_solve'"):
        optuna_search(n_trials=6, out=out, objective="final_return", **fake)
    with pytest.raises(ConfigError, match="algo_args"):
        optuna_search(n_trials=6, out=out, **{**fake, "algo_args": ["--max-frames", "900"]})


def test_one_trial_draws_no_importances_and_another_studys_folders_are_refused(fake, tmp_path,
                                                                               capsys):
    out = tmp_path / "search"
    optuna_search(n_trials=1, out=out, **{**fake, "quiet": False})
    said = capsys.readouterr()
    assert "param importances need 2 complete trials" in said.err
    assert said.out.strip().splitlines()[-1].startswith("rlstruct train ppo --max-frames 500 "
                                                        "--lr ")
    assert (out / "optuna_history.png").is_file()
    assert not (out / "optuna_importances.png").exists()
    journal = tmp_path / "other.journal"  # another study, in Optuna's journal file
    with pytest.raises(ConfigError, match="trial0, which the study's next trials would take"):
        optuna_search(n_trials=1, out=out, storage=f"journal:{journal}", **fake)
    assert journal.stat().st_size > 0


def test_the_pruner_stops_a_bad_trial_gracefully(fake, tmp_path, monkeypatch):
    out = tmp_path / "search"
    out.mkdir()
    storage = f"sqlite:///{out / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name="ppo-optuna", direction="minimize")
    study.enqueue_trial({"lr": 0.03})  # solves at 100 frames
    study.enqueue_trial({"lr": 0.0001})  # returns 0.1 per 100 frames: pruned at its first step
    monkeypatch.setenv("FAKE_ROW_S", "0.3")  # trial 1 would run 100 rows: 30 s
    result = optuna_search(n_trials=2, out=out, prune_startup_trials=1,
                           **{**fake, "max_parallel": 1, "algo_args": ["--max-frames", "10000"]})
    study = optuna.load_study(study_name="ppo-optuna", storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED"]
    assert study.trials[1].intermediate_values == {100: -0.1}
    pruned = result.results[1]  # stopped within seconds, by its own graceful stop
    assert pruned.status == "interrupted" and pruned.error == "" and pruned.frames <= 2000
    row = read_rows(out / "summary.csv")[1]
    assert row["state"] == "PRUNED" and row["status"] == "interrupted"
    assert result.failed == 0 and result.best["trial"] == 0


def test_sigterm_stops_the_search_gracefully_and_a_rerun_goes_on(fake, tmp_path, monkeypatch):
    out = tmp_path / "search"
    progress = out / "trial0" / "session0" / "fake_run" / "progress.csv"
    monkeypatch.setenv("FAKE_ROW_S", "0.2")

    def sigterm_once_running():
        deadline = time.monotonic() + 30
        while not progress.is_file() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=sigterm_once_running, daemon=True).start()
    kwargs = {**fake, "algo_args": ["--max-frames", "6000"]}
    with pytest.raises(Terminated):
        optuna_search(n_trials=1, out=out, **kwargs)
    storage = f"sqlite:///{out / 'study.db'}"
    (trial,) = optuna.load_study(study_name="ppo-optuna", storage=storage).trials
    assert trial.state.name == "FAIL" and trial.user_attrs["error"] == "search interrupted"
    (row,) = read_rows(out / "summary.csv")
    assert row["status"] == "interrupted" and row["state"] == "FAIL"  # the run's own stop
    assert row["error"].startswith("sweep interrupted")
    monkeypatch.setenv("FAKE_ROW_S", "0.01")
    again = optuna_search(n_trials=1, out=out, **kwargs)  # the failed trial does not count
    assert [r.trial for r in again.results] == [1] and again.best["trial"] == 1


# ------------------------------------------------------------------------------ real algorithm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_optuna_search_of_ppo_on_cartpole(tmp_path, monkeypatch, capsys):
    """Two trials of the real PPO, side by side (resuming is the fast tests' part)."""
    monkeypatch.chdir(REPO)  # python -m rlstruct.algos.ppo from the checkout
    out = tmp_path / "ppo"
    space = REPO / "examples" / "ppo_cartpole_space.json"
    assert main(["ppo", "--search", "optuna", "--space", str(space), "--trials", "2",
                 "--seeds", "0", "--max-parallel", "2", "--out", str(out), "--report-every", "64",
                 "--timeout", "200", "--", "--max-frames", "256", "--n-envs", "2",
                 "--n-processes", "1", "--eval-every", "0"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    study = optuna.load_study(study_name="ppo-optuna", storage=f"sqlite:///{out / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]  # none to compare
    rows = read_rows(out / "summary.csv")
    assert [r["status"] for r in rows] == ["budget", "budget"]  # 256 frames solve nothing
    assert [float(r["value"]) for r in rows] == [2 * float(r["frames"]) for r in rows]
    assert all(float(r["frames"]) >= 256 and Path(r["run_dir"]).is_dir() for r in rows)
    best = json.loads((out / "best.json").read_text())
    assert printed == best["command"] and best["trials"]["complete"] == 2
    cfg = tyro.cli(Config, args=shlex.split(printed)[3:])  # the line trains with these flags
    assert {k: getattr(cfg, k) for k in best["params"]} == best["params"]
    assert cfg.max_frames == 256 and cfg.layout.n_processes == 1
    assert (out / "optuna_importances.png").is_file()

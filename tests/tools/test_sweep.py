"""rlstruct.tools.sweep: trials x sessions as subprocesses, summary, trial graphs, failures, kills.

Fast tests drive a fake algorithm (a module written to tmp_path, put on PYTHONPATH) that writes a
run folder like Run does, fails, or hangs; the slow test sweeps the real rlstruct.algos.ppo.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from rlstruct.errors import ConfigError
from rlstruct.parallel.startup import Terminated
from rlstruct.runs.plotting import trial_curves
from rlstruct.tools.sessions import STOP_GRACE_S
from rlstruct.tools.sweep import (
    SUMMARY_COLUMNS,
    find_run_dir,
    main,
    override_flags,
    session_outcome,
    sweep,
)

REPO = Path(__file__).resolve().parents[2]

FAKE_ALGO = textwrap.dedent('''
    """A fake algorithm: argv like rlstruct.algos.*; writes a run folder as Run does (summary.json
    included); --mode fail|hang|ok|vetoed|decoy."""
    import argparse, json, os, signal, sys, time
    from pathlib import Path

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int)
    p.add_argument("--n-threads", type=int)
    p.add_argument("--runs-dir")
    p.add_argument("--learner-device", default="none")
    p.add_argument("--mode", default="ok")
    p.add_argument("--scale", type=float, default=1.0)
    a = p.parse_args()
    if a.mode == "fail":
        print("Traceback (most recent call last):", file=sys.stderr)
        print("rlstruct.errors.ConfigError: planted failure", file=sys.stderr)
        sys.exit(3)
    run = Path(a.runs_dir) / "fake_run"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"config": {
        "target_return": 30.0, "target_window": 2, "seed": a.seed}}))
    with open(run / "progress.csv", "w") as f:
        f.write("frames,episodes,wall_time,steps_per_s,train_return_mean2\\n")
        for i in range(1, 6):
            f.write(f"{100 * i},{i},{0.5 * i},200,{a.scale * (10 * i + a.seed)}\\n")
    (run / "env.json").write_text(json.dumps({
        "omp": os.environ.get("OMP_NUM_THREADS"), "device": a.learner_device,
        "threads": a.n_threads}))
    if a.mode == "stubborn":  # ignores SIGTERM: only SIGKILL ends it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        (run / "pid").write_text(str(os.getpid()))
        time.sleep(600)
    summary = {"status": "solved", "solved": True, "frames": 500, "wall_time": 2.5,
               "frames_to_solve": 300, "time_to_solve": 1.5, "eval_return": 33.0,
               "train_return_mean2": a.scale * (50 + a.seed)}
    if a.mode == "hang":  # SIGTERM ends it as Run does: a summary with status interrupted
        def stop(signum, frame):
            (run / "summary.json").write_text(json.dumps(dict(
                summary, status="interrupted", solved=False, frames_to_solve=None,
                time_to_solve=None)))
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # then die of it, as a run does
            os.kill(os.getpid(), signal.SIGTERM)
        signal.signal(signal.SIGTERM, stop)
        (run / "pid").write_text(str(os.getpid()))
        time.sleep(600)
    if a.mode == "vetoed":  # progress.csv meets the target, the evaluation vetoed it
        summary.update(status="budget", solved=False, frames_to_solve=None, time_to_solve=None,
                       eval_return=5.0)
    if a.mode == "decoy":  # prints another run folder: the sweep must not believe it
        decoy = Path(a.runs_dir).parent / "decoy_run"
        decoy.mkdir()
        (decoy / "summary.json").write_text(json.dumps(dict(summary, frames=999)))
        summary.update(status="failed", solved=False, error="RuntimeError: planted")
        print(f"outputs in {decoy}")
    if a.mode != "no_summary":
        (run / "summary.json").write_text(json.dumps(summary))
''')


@pytest.fixture
def fake_algo(tmp_path, monkeypatch):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "fake_algo.py").write_text(FAKE_ALGO)
    monkeypatch.setenv("PYTHONPATH", str(pkg))
    return "fake_algo"


def read_summary(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and tuple(rows[0]) == SUMMARY_COLUMNS
    return rows


# ------------------------------------------------------------------------------ unit tests
def test_override_flags():
    assert override_flags({"lr": 0.001, "n_epochs": 4}) == ["--lr", "0.001", "--n-epochs", "4"]
    assert override_flags({"anneal_lr": True}) == ["--anneal-lr"]
    assert override_flags({"anneal_lr": False}) == ["--no-anneal-lr"]
    assert override_flags({"hidden_sizes": [64, 64]}) == ["--hidden-sizes", "64", "64"]
    with pytest.raises(ConfigError, match="not a config field"):
        override_flags({"--lr": 1})


def write_run(folder: Path, rows: list[tuple[float, float]], target=None, window=1) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(
        {"config": {"target_return": target, "target_window": window}}))
    lines = ["frames,episodes,wall_time,steps_per_s,train_return_mean20"]
    lines += [f"{f},{i + 1},{i + 1.0},100,{r}" for i, (f, r) in enumerate(rows)]
    (folder / "progress.csv").write_text("\n".join(lines) + "\n")
    return folder


def test_trial_curves_span_the_longest_session_and_an_ended_one_keeps_its_last_value(tmp_path):
    a = write_run(tmp_path / "a", [(0, 0.0), (100, 10.0), (200, 20.0)])
    b = write_run(tmp_path / "b", [(50, 5.0), (150, 35.0), (300, 50.0)])
    c = write_run(tmp_path / "c", [(0, math.nan), (100, math.nan)])  # no value: left out
    curves = trial_curves([a, b, c], points=5, ma_window=2)
    assert int(curves["n_sessions"]) == 2
    # From the earliest first value to the latest last one: b's 300 frames, not a's 200.
    np.testing.assert_allclose(curves["frames"], [0, 75, 150, 225, 300])
    np.testing.assert_array_equal(curves["n_running"], [1, 2, 2, 1, 1])
    np.testing.assert_allclose(curves["ends"], [200, 300])
    # 0: only a has started; 75 and 150: both; 225 and 300: a has stopped at 20, b runs on.
    np.testing.assert_allclose(curves["mean"], [0.0, (7.5 + 12.5) / 2, (15 + 35) / 2,
                                                (20 + 42.5) / 2, (20 + 50) / 2])
    np.testing.assert_allclose(curves["min"], [0.0, 7.5, 15, 20, 20])
    np.testing.assert_allclose(curves["max"], [0.0, 12.5, 35, 42.5, 50])
    mean = curves["mean"]
    expected_ma = [mean[0], *[(mean[i - 1] + mean[i]) / 2 for i in range(1, 5)]]
    np.testing.assert_allclose(curves["ma"], expected_ma)
    assert np.all(curves["min"] <= curves["mean"]) and np.all(curves["mean"] <= curves["max"])


def test_trial_curves_without_values(tmp_path):
    empty = write_run(tmp_path / "e", [])
    curves = trial_curves([empty, tmp_path / "missing"])
    assert int(curves["n_sessions"]) == 0 and curves["frames"].size == 0


def test_the_mean_does_not_drop_when_the_first_session_stops(tmp_path):
    """Issue 27: the first seed solved and stopped, and the mean fell to the others' value."""
    a = write_run(tmp_path / "a", [(0, 0.0), (100, 500.0)])  # solved at 100 frames
    b = write_run(tmp_path / "b", [(0, 0.0), (100, 100.0), (200, 150.0)])
    curves = trial_curves([a, b], points=3, ma_window=1)
    np.testing.assert_allclose(curves["mean"], [0.0, 300.0, 325.0])
    assert np.all(np.diff(curves["mean"]) >= 0)
    np.testing.assert_array_equal(curves["n_running"], [2, 2, 1])


def test_trial_curves_before_a_session_starts_and_after_one_ends(tmp_path):
    a = write_run(tmp_path / "a", [(0, 1.0), (100, 1.0)])
    b = write_run(tmp_path / "b", [(200, 3.0), (300, 3.0)])
    curves = trial_curves([a, b], points=3, ma_window=3)
    np.testing.assert_allclose(curves["frames"], [0, 150, 300])
    np.testing.assert_allclose(curves["mean"], [1.0, 1.0, 2.0])  # a ended at 1.0; b joins
    np.testing.assert_array_equal(curves["n_running"], [1, 0, 1])
    np.testing.assert_allclose(curves["ma"], [1.0, 1.0, 4 / 3])
    with pytest.raises(ConfigError, match="ma_window >= 1"):
        trial_curves([a], ma_window=0)


def test_trial_figure_draws_the_longest_session(tmp_path):
    pytest.importorskip("matplotlib")
    from rlstruct.runs.plotting import trial_figure

    a = write_run(tmp_path / "a", [(0, 0.0), (100, 10.0)])
    b = write_run(tmp_path / "b", [(0, 0.0), (400, 40.0)])
    out = trial_figure([a, b], tmp_path / "t.png", ma_window=3)
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_session_outcome_is_what_summary_json_says(tmp_path):
    run = write_run(tmp_path / "r", [(100, 10.0), (200, 480.0), (300, 490.0)], target=475.0,
                    window=2)
    (run / "summary.json").write_text(json.dumps({
        "status": "solved", "solved": True, "frames": 320, "wall_time": 3.5,
        "frames_to_solve": 300, "time_to_solve": 3.0, "train_return_mean20": 491.0,
        "eval_return": 500.0}))
    assert session_outcome(run) == {
        "status": "solved", "solved": True, "frames_to_solve": 300.0, "time_to_solve": 3.0,
        "frames": 320.0, "wall_time": 3.5, "final_train_return": 491.0, "eval_return": 500.0}


def test_an_evaluation_veto_in_summary_json_is_not_overruled_by_progress_csv(tmp_path):
    # progress.csv meets the target at 200 frames; the run did not stop there because its
    # greedy evaluation disagreed, and ran out of budget: the run's verdict stands.
    run = write_run(tmp_path / "r", [(100, 10.0), (200, 480.0), (300, 490.0)], target=475.0,
                    window=2)
    (run / "summary.json").write_text(json.dumps({
        "status": "budget", "solved": False, "frames": 300, "wall_time": 3.0,
        "frames_to_solve": None, "time_to_solve": None, "train_return_mean20": 490.0,
        "eval_return": float("nan")}))
    out = session_outcome(run)
    assert out["status"] == "budget" and out["solved"] is False
    assert math.isnan(out["frames_to_solve"]) and math.isnan(out["eval_return"])
    assert out["frames"] == 300.0 and out["final_train_return"] == 490.0


def test_no_summary_json_is_no_outcome(tmp_path):
    run = write_run(tmp_path / "r", [(100, 1e9)], target=0.0)  # progress alone says nothing
    out = session_outcome(run)
    assert out["status"] == "" and out["solved"] is False
    assert all(math.isnan(out[k]) for k in ("frames", "wall_time", "final_train_return"))


def test_the_run_folder_is_the_one_run_directory_in_the_session_folder(tmp_path):
    session = tmp_path / "session0"
    assert find_run_dir(session) is None  # not made: the session failed before its run
    session.mkdir()
    (session / "stdout.log").write_text("outputs in /elsewhere\n")
    assert find_run_dir(session) is None
    run = write_run(session / "ppo_CartPole-v1_1", [(100, 1.0)])
    assert find_run_dir(session) == run
    write_run(session / "ppo_CartPole-v1_2", [(100, 1.0)])
    with pytest.raises(FileNotFoundError, match="holds 2 run directories"):
        find_run_dir(session)


@pytest.mark.parametrize("n_cuda", [0, 1])
def test_gpus_beyond_the_machine_are_refused_before_anything_starts(tmp_path, monkeypatch,
                                                                    n_cuda):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: n_cuda > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n_cuda)
    out = tmp_path / "sweep"
    with pytest.raises(ConfigError) as info:
        sweep("ppo", seeds=[1, 1], out=out, gpus=2, ma_window=0, module="no_such_module")
    message = str(info.value)
    assert "gpus=2" in message and ("CUDA is not available" if n_cuda == 0 else
                                    "has 1 CUDA device") in message
    assert "distinct" in message and "ma_window" in message  # every problem at once
    assert not out.exists()  # nothing was written, no session started
    with pytest.raises(SystemExit) as exc:
        main(["ppo", "--gpus", "2", "--out", str(out)])
    assert exc.value.code == 2 and not out.exists()


def test_slurm_without_submitit_is_refused_before_the_sweep_folder_exists(tmp_path,
                                                                          monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit: ImportError
    out = tmp_path / "sweep"
    with pytest.raises(ConfigError, match=r"needs submitit \(the 'slurm' extra\)"):
        sweep("ppo", seeds=[0], out=out, launcher="slurm")
    assert not out.exists()


def test_ma_window_flag_reaches_the_sweep(monkeypatch):
    import rlstruct.tools.sweep as sweep_module

    seen = {}
    monkeypatch.setattr(sweep_module, "sweep", lambda *a, **kw: seen.update(kw) or [])
    assert main(["ppo", "--ma-window", "25"]) == 0
    assert seen["ma_window"] == 25
    assert main(["ppo"]) == 0 and seen["ma_window"] == 10  # the default, as before


def test_bad_arguments():
    with pytest.raises(ConfigError, match="at least one seed"):
        sweep("ppo", seeds=[])
    with pytest.raises(ConfigError, match="distinct"):
        sweep("ppo", seeds=[1, 1])
    with pytest.raises(SystemExit) as exc:
        main(["ppo", "--trials", "not json"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main(["ppo", "--trials", '{"lr": 1}'])


# ------------------------------------------------------------------------------ fake algorithm
def test_sweep_with_a_failing_trial(fake_algo, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sweep"
    results = sweep("fake", seeds=[0, 1], trials=[{}, {"mode": "fail"}], out=out,
                    module=fake_algo, max_parallel=2, quiet=True, poll_s=0.05, timeout=60)
    assert [(r.trial, r.session, r.seed) for r in results] == [
        (0, 0, 0), (0, 1, 1), (1, 0, 0), (1, 1, 1)]
    good, bad = results[:2], results[2:]
    assert all(r.ok and r.returncode == 0 and r.error == "" for r in good)
    assert all(not r.ok and r.returncode == 3 for r in bad)
    assert all("planted failure" in r.error and "exit status 3" in r.error for r in bad)
    # Seed 0 solves at the 3rd row (return 30), seed 1 at the 3rd too (31).
    assert [(r.status, r.solved) for r in good] == [("solved", True), ("solved", True)]
    assert [r.frames_to_solve for r in good] == [300.0, 300.0]
    assert [r.final_train_return for r in good] == [50.0, 51.0]
    assert [(r.status, r.run_dir) for r in bad] == [("", ""), ("", "")]  # no run was made
    rows = read_summary(out / "summary.csv")
    assert [row["error"] == "" for row in rows] == [True, True, False, False]
    assert (out / "trial0.png").is_file() and (out / "trial1.png").is_file()
    for r in good:
        assert Path(r.run_dir).parent == out / f"trial{r.trial}" / f"session{r.session}"
        env = json.loads((Path(r.run_dir) / "env.json").read_text())
        assert env == {"omp": "1", "device": "none", "threads": 1}  # no GPU: no device flag
    assert json.loads((out / "sweep.json").read_text())["seeds"] == [0, 1]


def test_the_sweep_reads_each_runs_verdict_not_its_progress_nor_its_stdout(fake_algo, tmp_path):
    out = tmp_path / "sweep"
    results = sweep("fake", seeds=[0], trials=[{"mode": "vetoed"}, {"mode": "decoy"},
                                               {"mode": "no_summary"}],
                    out=out, module=fake_algo, quiet=True, poll_s=0.05, timeout=60)
    vetoed, decoy, silent = results
    # progress.csv meets the target (30) at 300 frames; the run said "budget": not solved
    assert (vetoed.status, vetoed.solved, vetoed.eval_return) == ("budget", False, 5.0)
    assert vetoed.ok and math.isnan(vetoed.frames_to_solve)
    # it printed "outputs in <a solved decoy>": the sweep reads its own folder's run
    assert Path(decoy.run_dir) == out / "trial1" / "session0" / "fake_run"
    assert (decoy.status, decoy.solved, decoy.frames) == ("failed", False, 500.0)
    # exit status 0 without a summary.json is not a good session
    assert silent.returncode == 0 and silent.status == "" and not silent.ok
    assert "wrote no summary.json" in silent.error
    rows = read_summary(out / "summary.csv")
    assert [row["status"] for row in rows] == ["budget", "failed", ""]
    assert [row["solved"] for row in rows] == ["False", "False", "False"]


def test_a_sweep_folder_is_not_reused_and_the_algorithm_must_exist(fake_algo, tmp_path):
    out = tmp_path / "sweep"
    assert sweep("fake", seeds=[0], out=out, module=fake_algo, quiet=True, poll_s=0.05)[0].ok
    with pytest.raises(ConfigError, match=r"1 session folder\(s\) exist already"):
        sweep("fake", seeds=[0], out=out, module=fake_algo, quiet=True)
    with pytest.raises(ConfigError, match=r"no algorithm 'nope' \(no module rlstruct\.algos\.nope"):
        sweep("nope", seeds=[0], out=tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_flags_after_the_double_dash_go_to_every_session(monkeypatch, capsys):
    import rlstruct.tools.sweep as sweep_module

    seen = {}
    monkeypatch.setattr(sweep_module, "sweep", lambda *a, **kw: seen.update(kw, algo=a[0]) or [])
    assert main(["ppo", "--seeds", "3", "4", "--max-parallel", "2", "--",
                 "--max-frames", "100", "--", "--lr", "0.1"]) == 0
    assert seen["algo"] == "ppo" and seen["seeds"] == (3, 4) and seen["max_parallel"] == 2
    assert seen["algo_args"] == ("--max-frames", "100", "--", "--lr", "0.1")
    with pytest.raises(SystemExit) as exc:  # an algorithm flag before -- is the sweep's
        main(["ppo", "--max-frames", "100"])
    assert exc.value.code == 2 and "--max-frames" in capsys.readouterr().err


def test_sweep_rotates_gpus(fake_algo, tmp_path, monkeypatch):
    import torch

    # A machine with 2 GPUs, as far as the sweep's up-front check can tell; no other CUDA call.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_OFFSET", "1")
    results = sweep("fake", seeds=[0, 1, 2], trials=[{}, {"scale": 2.0}], out=tmp_path / "s",
                    module=fake_algo, gpus=2, quiet=True, poll_s=0.05, max_parallel=2)
    # (t * 3 + s + 1) % 2
    assert [r.device for r in results] == ["cuda:1", "cuda:0", "cuda:1", "cuda:0", "cuda:1",
                                           "cuda:0"]
    seen = [json.loads((Path(r.run_dir) / "env.json").read_text())["device"] for r in results]
    assert seen == [r.device for r in results]


def test_timeout_kills_the_session_group(fake_algo, tmp_path):
    results = sweep("fake", seeds=[0], trials=[{"mode": "hang"}], out=tmp_path / "s",
                    module=fake_algo, timeout=1.0, quiet=True, poll_s=0.05)
    (r,) = results
    assert not r.ok and "timed out" in r.error and r.returncode is not None
    assert r.returncode < 0  # killed by a signal
    assert r.status == "interrupted"  # what the run wrote when SIGTERM ended it
    # conftest's no_leftover_processes fixture fails this test if anything survived.


def test_interrupt_kills_running_sessions(fake_algo, tmp_path, monkeypatch):
    import rlstruct.tools.sweep as sweep_module

    calls = {"n": 0}
    real_sleep = sweep_module.time.sleep

    def interrupt(seconds):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(sweep_module.time, "sleep", interrupt)
    with pytest.raises(KeyboardInterrupt):
        sweep("fake", seeds=[0, 1], trials=[{"mode": "hang"}], out=tmp_path / "s",
              module=fake_algo, max_parallel=1, quiet=True, poll_s=0.05)
    rows = read_summary(tmp_path / "s" / "summary.csv")
    assert "interrupted" in rows[0]["error"] and rows[1]["error"] == "not run: sweep interrupted"


SWEEP_SCRIPT = textwrap.dedent("""
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job ignores it
    from rlstruct.runs.signals import exit_code
    from rlstruct.tools.sweep import sweep
    try:
        sweep("fake", seeds=[0, 1], trials=[{"mode": sys.argv[2]}], out=sys.argv[1],
              module="fake_algo", quiet=True, poll_s=0.05)
    except KeyboardInterrupt as stop:
        sys.exit(exit_code(stop))
""")


def sweep_process(out: Path, mode: str) -> tuple[subprocess.Popen, list[int]]:
    """A sweep of two ``mode`` sessions of the fake algorithm in a subprocess (PYTHONPATH from
    the fake_algo fixture); returns it once both sessions run, with their pids."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]]))
    proc = subprocess.Popen([sys.executable, "-c", SWEEP_SCRIPT, str(out), mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    files = [out / "trial0" / f"session{s}" / "fake_run" / "pid" for s in (0, 1)]
    while not all(f.exists() and f.read_text() for f in files):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the sessions did not start: {proc.communicate()[1]}")
        time.sleep(0.05)
    return proc, [int(f.read_text()) for f in files]


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    """The pids still running (not zombies) after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def session_statuses(out: Path) -> list[str]:
    return [json.loads(f.read_text())["status"]
            for f in sorted(out.glob("trial0/session*/fake_run/summary.json"))]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_stops_the_sweeps_sessions_gracefully_and_exits_0(fake_algo, tmp_path):
    out = tmp_path / "s"
    proc, pids = sweep_process(out, "hang")
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert not wait_gone(pids, 5)
    assert session_statuses(out) == ["interrupted", "interrupted"]  # each run's own stop
    rows = read_summary(out / "summary.csv")
    assert [r["status"] for r in rows] == ["interrupted", "interrupted"], rows


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_sessions_of_a_killed_sweep_stop_gracefully_within_seconds(fake_algo, tmp_path):
    out = tmp_path / "s"
    proc, pids = sweep_process(out, "hang")
    proc.kill()
    proc.communicate(timeout=30)
    try:
        assert not wait_gone(pids, 5), "the sessions of a SIGKILLed sweep trained on"
        assert session_statuses(out) == ["interrupted", "interrupted"]  # SIGTERM, not SIGKILL
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_twice_kills_the_sessions_at_once_and_still_writes_the_summary(fake_algo,
                                                                             tmp_path):
    out = tmp_path / "s"
    proc, pids = sweep_process(out, "stubborn")  # SIGTERM alone would take the whole grace
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    # at once: well before SIGTERM's grace (10.8 s once under a load of 7 on 2 cores)
    assert proc.returncode == 130 and time.monotonic() - start < STOP_GRACE_S - 5, err
    assert not wait_gone(pids, 5)
    rows = read_summary(out / "summary.csv")
    assert len(rows) == 2 and all("sweep interrupted" in r["error"] for r in rows), rows


def test_the_command_exits_0_after_sigterm_and_130_after_ctrl_c(monkeypatch, capsys):
    import rlstruct.tools.sweep as sweep_module

    for signum, code in ((signal.SIGTERM, 0), (signal.SIGINT, 130)):
        def stopped(*args, signum=signum, **kwargs):
            raise Terminated(signum)

        monkeypatch.setattr(sweep_module, "sweep", stopped)
        assert main(["ppo"]) == code
        assert f"stopped by {signal.Signals(signum).name} (exit code {code})" in \
            capsys.readouterr().err


# ------------------------------------------------------------------------------ real algorithm
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sweep_ppo_two_seeds_and_a_failing_trial(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(REPO)  # python -m rlstruct.algos.ppo from the checkout
    out = tmp_path / "ppo"
    code = main([
        "ppo", "--seeds", "0", "1", "--trials", '[{}, {"n_epochs": 0}]', "--out", str(out),
        "--max-parallel", "2", "--timeout", "300",
        "--", "--max-frames", "1500", "--n-envs", "2", "--n-timesteps", "16",
        "--eval-every", "0", "--n-processes", "1",
    ])
    assert code == 1  # one trial failed
    rows = read_summary(out / "summary.csv")
    good = [r for r in rows if r["trial"] == "0"]
    bad = [r for r in rows if r["trial"] == "1"]
    assert len(good) == 2 and all(r["error"] == "" and r["returncode"] == "0" for r in good)
    assert all(float(r["frames"]) >= 1500 for r in good)
    assert all(Path(r["run_dir"]).is_dir() for r in good)
    assert len(bad) == 2 and all(
        "exit status 2" in r["error"] and "need n_epochs >= 1" in r["error"] for r in bad)
    assert (out / "trial0.png").is_file() and (out / "trial1.png").is_file()

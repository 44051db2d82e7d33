"""Graceful stops (rlstruct/runs/signals.py): SIGTERM and Ctrl-C end a run from the command line
with a final checkpoint whose frames are the summary's, status ``interrupted``, one line on
stderr and no traceback, exit code 0 after SIGTERM and 130 after Ctrl-C, under every layout; a
second signal ends the run at once. Each run is a subprocess in its own session, killed with its
whole process group afterwards."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlstruct.runs.signals import StopSignals, Terminated

ROOT = Path(__file__).resolve().parents[2]
#: A run that never stops by itself, checkpoints only at its end and learns a lot per segment.
LONG = ["--target-return", "None", "--max-frames", "100000000", "--time-budget", "300",
        "--checkpoint-every", "100000", "--eval-every", "0"]


class Session:
    """``python -m rlstruct.algos.ALGO ...`` (or another command) in its own session."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.cwd = cwd
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        self.out = self.err = ""
        self.took = 0.0

    def wait_rows(self, n: int, timeout: float = 120.0) -> None:
        """Until progress.csv holds ``n`` rows."""
        deadline = time.monotonic() + timeout
        while len(self.rows()) < n:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                _out, err = self.proc.communicate(timeout=30)
                raise AssertionError(f"no {n} progress rows: rc {self.proc.returncode}\n{err}")
            time.sleep(0.1)

    def rows(self) -> list[dict[str, str]]:
        files = list(self.cwd.glob("runs/*/progress.csv"))
        if not files:
            return []
        with open(files[0], newline="") as f:
            return list(csv.DictReader(f))

    def signal(self, sig: int, group: bool = False, then: int | None = None,
               after: float = 0.0, timeout: float = 60.0) -> int:
        """Sends ``sig`` (to the whole process group, as a terminal does, with ``group``),
        optionally ``then`` a second signal ``after`` seconds later; waits for the end."""
        send = (lambda s: os.killpg(self.proc.pid, s)) if group else self.proc.send_signal
        sent = time.monotonic()
        send(sig)
        if then is not None:
            time.sleep(after)
            send(then)
        self.out, self.err = self.proc.communicate(timeout=timeout)
        self.took = time.monotonic() - sent
        return self.proc.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.communicate(timeout=10)

    def group_alive(self) -> bool:
        """A process of the session's group is alive (zombies, which a container's init may
        leave unreaped, do not count)."""
        import psutil

        for proc in psutil.process_iter(["pid", "status"]):
            with contextlib.suppress(psutil.Error):
                if (os.getpgid(proc.pid) == self.proc.pid
                        and proc.info["status"] != psutil.STATUS_ZOMBIE):
                    return True
        return False

    def run_dir(self) -> Path:
        (run_dir,) = (self.cwd / "runs").iterdir()
        return run_dir


@contextlib.contextmanager
def session(cmd: list[str], cwd: Path, env: dict[str, str] | None = None):
    s = Session(cmd, cwd, env)
    try:
        yield s
    finally:
        s.kill()


def algo(name: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", f"rlstruct.algos.{name}", *LONG, *flags]


def assert_graceful(s: Session, rc: int, expected_rc: int, sig_name: str) -> dict:
    """Exit code, one line on stderr without a traceback, and a final checkpoint that holds
    the summary's frames and iteration, as does the last progress row."""
    assert "Traceback" not in s.err, s.err
    assert rc == expected_rc, s.err
    lines = [ln for ln in s.err.splitlines() if ln.strip() and not ln.startswith("ppo ")
             and " | " not in ln]  # the progress lines of the console
    assert lines == [lines[-1]] and f"stopped by {sig_name}" in lines[-1], s.err
    summary = json.loads((s.run_dir() / "summary.json").read_text())
    assert summary["status"] == "interrupted" and sig_name in summary["error"], summary
    checkpoint = torch.load(s.run_dir() / "checkpoints" / "latest.pt", weights_only=False)
    assert checkpoint["frames"] == summary["frames"] == summary["checkpoint"]["frames"]
    assert checkpoint["iteration"] == summary["iterations"]
    assert int(s.rows()[-1]["frames"]) == summary["frames"]
    assert not list((s.run_dir() / "checkpoints").glob("*.tmp"))
    assert s.took < 25, f"the stop took {s.took:.1f} s (Slurm and torchrun SIGKILL at 30 s)"
    deadline = time.monotonic() + 10
    while s.group_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not s.group_alive(), "processes of the run were left behind"
    return summary


# ----------------------------------------------------------------------------- in-process
def test_a_signal_in_a_deferred_block_waits_for_it_and_a_second_one_would_end_the_process():
    signals = StopSignals(on_hard_exit=lambda: None)
    try:
        with signals.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs: nothing raised inside the block
            assert signals.requested and signals.signum == signal.SIGTERM
        assert isinstance(signals.stop_now(), Terminated)
    finally:
        signals.restore()


def test_a_deferred_stop_interrupts_a_block_that_outlasts_its_grace():
    signals = StopSignals(on_hard_exit=lambda: None, grace=0.3)
    start = time.monotonic()
    try:
        with pytest.raises(Terminated) as info, signals.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            while time.monotonic() - start < 10:
                time.sleep(0.01)
    finally:
        signals.restore()
    assert info.value.signum == signal.SIGINT and time.monotonic() - start < 5


def test_a_signal_outside_a_deferred_block_raises_at_once():
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or Ray's from an earlier test here
    signals = StopSignals()
    try:
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    finally:
        signals.restore()
    assert signal.getsignal(signal.SIGTERM) is before


# ----------------------------------------------------------------------------- one process
@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("sig, rc", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_sigterm_exits_0_and_ctrl_c_130_with_one_line_and_a_matching_checkpoint(tmp_path, sig,
                                                                                 rc):
    # Ctrl-C goes to the whole process group, as a terminal sends it: workers ignore it.
    with session(algo("ppo", "--n-processes", "2"), tmp_path) as s:
        s.wait_rows(2)
        got = s.signal(sig, group=sig == signal.SIGINT)
        assert_graceful(s, got, rc, signal.Signals(sig).name)
        assert "stopped by interrupted" in s.out


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig, rc", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_stop_in_a_learner_groups_learn_phase_checkpoints_the_learned_batch(tmp_path, sig, rc):
    # 60 epochs: the two ranks learn most of the time, so the signal lands in a learn phase.
    # Both signals go to the process group: the ranks and the forkserver must not die of them.
    flags = ("--n-learners", "2", "--n-processes", "2", "--n-epochs", "60")
    with session(algo("ppo", *flags), tmp_path) as s:
        s.wait_rows(3)
        got = s.signal(sig, group=True)
        assert_graceful(s, got, rc, signal.Signals(sig).name)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_pipelined_appo_stops_with_a_matching_checkpoint(tmp_path):
    with session(algo("appo", "--pipeline", "2", "--n-processes", "2"), tmp_path) as s:
        s.wait_rows(3)
        assert_graceful(s, s.signal(signal.SIGTERM), 0, "SIGTERM")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_second_signal_ends_the_run_at_once(tmp_path):
    # The first SIGTERM waits for the learn phase (long here); Ctrl-C then ends it at once.
    flags = ("--n-learners", "2", "--n-processes", "2", "--n-epochs", "400")
    with session(algo("ppo", *flags), tmp_path) as s:
        s.wait_rows(1)
        rc = s.signal(signal.SIGTERM, then=signal.SIGINT, after=0.3, timeout=30)
        assert rc == 130 and "Traceback" not in s.err, s.err
        assert "second signal (SIGINT)" in s.err and s.took < 5
        assert not list((s.run_dir() / "checkpoints").glob("*.tmp"))
        time.sleep(1)
        assert not s.group_alive(), "processes of the run were left behind"


# ----------------------------------------------------------------------------- torchrun
def torchrun(*flags: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", "-m", "rlstruct.algos.ppo", *LONG, "--n-processes", "1", "--n-envs", "4",
            *flags]


def rank_pid(s: Session, rank: int) -> int:
    import psutil

    for proc in psutil.Process(s.proc.pid).children(recursive=True):  # the agent's workers
        with contextlib.suppress(psutil.Error, OSError):
            if ("rlstruct.algos.ppo" in proc.cmdline()
                    and proc.environ().get("RANK") == str(rank)):
                return proc.pid
    raise AssertionError(f"no process of rank {rank}")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_to_torchrun_stops_rank_0_with_a_matching_checkpoint_within_its_30_s(tmp_path):
    # torchrun's agent forwards the SIGTERM to every rank and sends SIGKILL 30 s later.
    with session(torchrun("--n-epochs", "40"), tmp_path) as s:
        s.wait_rows(3)
        s.signal(signal.SIGTERM)
        assert s.took < 25, s.out + s.err
        summary = json.loads((s.run_dir() / "summary.json").read_text())
        assert summary["status"] == "interrupted" and "SIGTERM" in summary["error"], summary
        checkpoint = torch.load(s.run_dir() / "checkpoints" / "latest.pt", weights_only=False)
        assert checkpoint["frames"] == summary["frames"] == int(s.rows()[-1]["frames"])
        # Rank 0 ends with one line and exit code 0 (torchrun's agent itself prints its own
        # SignalException traceback and exits 1: torch's design, not the run's).
        assert "stopped by SIGTERM (exit code 0)" in s.err, s.err
        assert "rlstruct/" not in s.err.split("SignalException")[0].split("exit code 0)")[-1]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("epochs", ["20", "1"])  # 1: rank 0 mostly collects, when the agent
def test_a_torchrun_rank_killed_by_sigkill_is_named_in_the_summary(tmp_path, epochs):
    # SIGTERMs it; 20: a collective of rank 0's learn phase fails first.
    with session(torchrun("--n-epochs", epochs), tmp_path) as s:
        s.wait_rows(3)
        pid = rank_pid(s, 1)
        os.kill(pid, signal.SIGKILL)
        s.out, s.err = s.proc.communicate(timeout=60)
        summary = json.loads((s.run_dir() / "summary.json").read_text())
        assert summary["status"] == "failed", summary
        assert "rank 1" in summary["error"] and str(pid) in summary["error"], summary["error"]


# ----------------------------------------------------------------------------- Ray
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("flags", [("--backend", "ray", "--n-processes", "2"),
                                   ("--learner-backend", "ray", "--n-learners", "2",
                                    "--n-processes", "2")], ids=["backend", "learner_ranks"])
def test_sigterm_under_ray_keeps_the_runs_handler_and_checkpoints(tmp_path, flags):
    # ray.init installs sys.exit(signum) on SIGTERM: the run's own handler must be back.
    pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
    with session(algo("ppo", *flags), tmp_path, env={"RAY_USAGE_STATS_ENABLED": "0"}) as s:
        s.wait_rows(2, timeout=200)
        rc = s.signal(signal.SIGTERM)
        assert rc == 0 and "stopped by SIGTERM (exit code 0)" in s.err, s.err
        summary = json.loads((s.run_dir() / "summary.json").read_text())
        assert summary["status"] == "interrupted" and "SIGTERM" in summary["error"], summary
        checkpoint = torch.load(s.run_dir() / "checkpoints" / "latest.pt", weights_only=False)
        assert checkpoint["frames"] == summary["frames"] == int(s.rows()[-1]["frames"])
        assert s.took < 25

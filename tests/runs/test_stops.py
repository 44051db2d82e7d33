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
import textwrap
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


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_more_sigterms_are_ignored_in_the_grace_period_and_in_the_teardown():
    # Kubernetes' and systemd's contract: one SIGTERM starts the grace period, SIGKILL is the
    # force. In a subprocess: a second SIGTERM used to end the process (exit code 143).
    done = run_python(textwrap.dedent("""
        import os, signal, time
        from rlstruct.runs.signals import StopSignals
        signals = StopSignals()
        with signals.deferred():  # a learn phase
            for _ in range(3):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
        print("learned", signals.signum == signal.SIGTERM, flush=True)
        signals.teardown()  # the final checkpoint (SAC's buffer write)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        print("checkpointed", flush=True)
    """))
    assert done.returncode == 0 and done.stdout.split() == ["learned", "True", "checkpointed"], \
        done.stderr


def test_a_terminated_that_a_library_turned_into_a_bare_keyboard_interrupt_is_the_signal():
    # Ray's ray.get and ray.wait run the signal handlers inside their wait and raise a bare
    # KeyboardInterrupt() for the Terminated the handler raised: a SIGTERM then ended the run
    # with exit code 130, as if it were Ctrl-C.
    signals = StopSignals()
    try:
        try:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except KeyboardInterrupt:  # what Ray's check_signals and check_status do
                raise KeyboardInterrupt() from None
        except KeyboardInterrupt as exc:
            caught = exc
        end = signals.ending(caught, None)
    finally:
        signals.restore()
    assert end.by_signal and end.finish
    assert signals.stop_now().signum == signal.SIGTERM


def test_a_signal_before_the_runs_handlers_exist_is_one_line_and_its_exit_code(monkeypatch,
                                                                               capsys):
    # The config check and a resume's checkpoint load (resolve) come before Run's handlers.
    from rlstruct.algos import ppo
    from rlstruct.parallel import startup
    from rlstruct.runs import resolve as resolve_module

    def slow_resolve(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(resolve_module, "resolve", slow_resolve)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    startup.install()  # what the package's first line does in a command
    try:
        with pytest.raises(SystemExit) as info:
            resolve_module.run_cli(ppo.main, ppo.Config, args=[], prog="rlstruct train ppo")
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    err = capsys.readouterr().err
    assert info.value.code == 0 and "rlstruct train ppo: stopped by SIGTERM (exit code 0)" in err
    assert "Traceback" not in err


def sigterm_caught(pid: int) -> bool:
    """The process has a handler for SIGTERM (its SigCgt mask in /proc)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig, rc", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_signal_while_the_command_imports_is_one_line_and_its_exit_code(tmp_path, sig, rc):
    # From the first line the command runs (the package's), not only once the run exists.
    with session(algo("ppo", "--n-processes", "1"), tmp_path) as s:
        start = time.monotonic()
        while not sigterm_caught(s.proc.pid) and time.monotonic() - start < 1.0:
            time.sleep(0.005)  # the start-up handler, before torch is imported
        got = s.signal(sig, group=True)
        assert "Traceback" not in s.err and got == rc, s.err
        lines = [ln for ln in s.err.splitlines() if ln.strip()]
        assert len(lines) == 1 and f"stopped by {signal.Signals(sig).name}" in lines[0], s.err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_while_the_forkserver_starts_reaches_the_driver_only(tmp_path):
    # The forkserver imports torch before multiprocessing makes it ignore SIGINT: started
    # with SIGINT blocked, it (and every worker forked from it) never sees a terminal's Ctrl-C.
    import psutil

    with session(algo("ppo", "--n-processes", "2"), tmp_path) as s:
        deadline = time.monotonic() + 60
        while not any("forkserver" in line for line in _command_lines(s.proc.pid)):
            assert time.monotonic() < deadline and s.proc.poll() is None, "no forkserver"
            time.sleep(0.01)
        time.sleep(0.2)  # the forkserver imports its preload list
        got = s.signal(signal.SIGINT, group=True)
        assert "Traceback" not in s.err and "KeyboardInterrupt" not in s.err, s.err
        assert got == 130 and "stopped by SIGINT" in s.err, s.err
        deadline = time.monotonic() + 10
        while s.group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not s.group_alive(), psutil.pids()


def _command_lines(pid: int) -> list[str]:
    """The command lines of the descendants of ``pid`` (those that can be read)."""
    import psutil

    lines = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                lines.append(" ".join(child.cmdline()))
    return lines


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
    if sig == signal.SIGTERM:  # a second session on the folder is refused and starts nothing
        from rlstruct.runs.lock import FolderLock

        with FolderLock(s.run_dir()), session(algo("ppo", "--resume", str(s.run_dir())),
                                              tmp_path) as refused:
            refused.out, refused.err = refused.proc.communicate(timeout=60)
            assert refused.proc.returncode == 2 and "is in use by pid" in refused.err
            assert not refused.group_alive(), "a refused session left a process behind"


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig, rc", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_stop_in_a_learner_groups_learn_phase_checkpoints_the_learned_batch(tmp_path, sig, rc):
    # 60 epochs: the two ranks learn most of the time, so the signal lands in a learn phase.
    # Both signals go to the process group: the ranks and the forkserver must not die of them.
    flags = ("--n-learners", "2", "--n-processes", "2", "--n-epochs", "60")
    with session(algo("ppo", *flags), tmp_path) as s:
        s.wait_rows(3)
        # SIGTERM twice (a process-group kill, scancel with a forwarding trap): the second is
        # ignored, the final checkpoint is written all the same.
        again = signal.SIGTERM if sig == signal.SIGTERM else None
        got = s.signal(sig, group=True, then=again, after=0.3)
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


@pytest.mark.slow
def test_a_job_stopped_and_continued_past_its_worker_timeout_runs_on(tmp_path):
    """SIGSTOP to the whole process group, as a suspended Slurm job or Ctrl-Z gets, for 15 s:
    longer than the workers' 5-s timeout. The workers were stopped with the driver, so the
    pause is not their silence: after SIGCONT the run goes on, and a SIGTERM stops it as usual
    (it raised WorkerTimeoutError as soon as it was continued, before the pause was told
    apart). The env's 20-ms steps keep the driver waiting for its workers almost all the time
    (a segment of 50 steps takes 1 s, its learning milliseconds), so the stop finds it there."""
    cmd = algo("ppo", "--env-module", "support.toy_envs", "--env-id", "SlowStep-v0",
               "--n-processes", "2", "--n-envs", "1", "--n-timesteps", "50",
               "--worker-timeout", "5", "--progress-every-s", "0")
    tests = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}  # the toy env
    with session(cmd, tmp_path, tests) as s:
        s.wait_rows(3)
        os.killpg(s.proc.pid, signal.SIGSTOP)
        time.sleep(15)
        os.killpg(s.proc.pid, signal.SIGCONT)
        paused_at = len(s.rows())
        s.wait_rows(paused_at + 3, timeout=60)  # learning on after the pause
        summary = assert_graceful(s, s.signal(signal.SIGTERM), 0, "SIGTERM")
    assert summary["frames"] > 0


LEARNING_WHEN_STOPPED = textwrap.dedent("""
    import time
    from support import toy_envs
    from rlstruct import Agent, Batcher, DictTensor
    from rlstruct.envs import GymEnvInf

    class Left(Agent):
        def __call__(self, state, observation, agent_info):
            return DictTensor({"action": observation["env_step"] * 0}), state

    if __name__ == "__main__":
        with Batcher(100, Left, {}, GymEnvInf, {"env": [toy_envs.SlowStep]}, n_processes=2,
                     timeout=4.0) as batcher:  # a segment: 100 steps of 20 ms, 2 s
            batcher.reset()
            batcher.execute()
            batcher.get()
            batcher.execute()
            print("learning", flush=True)
            start = time.monotonic()
            while time.monotonic() - start < 5:  # the learner's turn: the stop finds it here
                pass
            trajectories, _ = batcher.get()
            print("segment", int(trajectories.lengths.sum()), flush=True)
""")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stop_that_finds_the_driver_learning_with_a_segment_under_way_is_no_silence(tmp_path):
    """SIGSTOP to the process group for 13 s while the driver computes (a learner's step), its
    workers 0.5 s into a 2-s segment, with a 4-s worker timeout: once continued, the segment
    comes back. The pause watch told the pause apart; the waiting loop alone could not (it
    measured 13 s of silence, and raised WorkerTimeoutError as soon as it looked)."""
    s = Session([sys.executable, "-c", LEARNING_WHEN_STOPPED], tmp_path,
                {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])})
    try:
        assert s.proc.stdout is not None
        assert s.proc.stdout.readline().strip() == "learning", s.proc.communicate(timeout=30)
        time.sleep(0.5)
        os.killpg(s.proc.pid, signal.SIGSTOP)
        time.sleep(13)
        os.killpg(s.proc.pid, signal.SIGCONT)
        out, err = s.proc.communicate(timeout=60)
    finally:
        s.kill()
    assert s.proc.returncode == 0 and "segment 200" in out, err
    deadline = time.monotonic() + 10  # its forkserver leaves once the script has exited
    while s.group_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not s.group_alive(), "processes of the script were left behind"

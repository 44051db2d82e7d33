"""Every wait has a deadline, and close() releases everything at once (issue 9, sections 2, 4).

Scenarios that hang on a regression (a frozen worker) run in a subprocess with a timeout, in a
session of their own, and the whole process group is killed whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from multiprocessing.connection import Connection
from pathlib import Path

import gymnasium as gym
import psutil
import pytest
import torch
from support.agents import DeterministicAgent
from support.batcher_helpers import counter_env

from rlstruct.batchers import Batcher
from rlstruct.envs.gym import GymEnvInf
from rlstruct.errors import WorkerError
from rlstruct.parallel import transport

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- transport
def pipe_pair() -> tuple[Connection, Connection]:
    a, b = socket.socketpair()
    return Connection(a.detach()), Connection(b.detach())


def test_bounded_send_gives_up_at_the_deadline_when_nobody_reads():
    mine, theirs = pipe_pair()
    with mine, theirs:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            transport.send(mine, b"x" * (8 << 20), time.monotonic() + 0.3)
        assert 0.25 < time.monotonic() - start < 2.0
        assert os.get_blocking(mine.fileno())  # left as it was


def test_bounded_recv_gives_up_at_the_deadline_when_nothing_comes():
    mine, theirs = pipe_pair()
    with mine, theirs:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            transport.recv(mine, time.monotonic() + 0.2)
        assert time.monotonic() - start < 2.0


def test_bounded_recv_gives_up_on_a_message_cut_in_the_middle():
    mine, theirs = pipe_pair()
    with mine, theirs:
        frame = transport._frame({"big": b"y" * 1000})
        os.write(theirs.fileno(), frame[:100])  # a frozen sender, half-way through
        with pytest.raises(TimeoutError):
            transport.recv(mine, time.monotonic() + 0.2)


@pytest.mark.parametrize("payload", [None, ("cmd", 3), b"z" * (3 << 20), torch.arange(10)])
def test_bounded_send_and_recv_speak_the_connection_protocol(payload):
    mine, theirs = pipe_pair()
    with mine, theirs:
        if isinstance(payload, bytes):  # larger than the socket buffer: read concurrently
            import threading

            got = []
            reader = threading.Thread(target=lambda: got.append(theirs.recv()))
            reader.start()
            transport.send(mine, payload, time.monotonic() + 10)
            reader.join(10)
            assert got == [payload]
        else:
            transport.send(mine, payload, time.monotonic() + 10)
            received = theirs.recv()
            if torch.is_tensor(payload):
                assert torch.equal(received, payload)
            else:
                assert received == payload
        theirs.send(("answer", payload is None))
        assert transport.recv(mine, time.monotonic() + 10) == ("answer", payload is None)


# ---------------------------------------------------------------------------- scripts
def run_script(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter, in its own session; kills the group at the end."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the script hung for {timeout} s:\n{out}\n{err}")
    finally:
        with_group_killed(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def with_group_killed(pgid: int) -> None:
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                os.kill(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            pass


FROZEN_UPDATE = """
    import os, signal, sys, time
    import torch
    from support.agents import DeterministicAgent
    from support.batcher_helpers import counter_env
    from rlstruct.batchers import Batcher
    from rlstruct.errors import WorkerTimeoutError

    class AcceptsAnything(DeterministicAgent):
        def update(self, info):
            pass

    if __name__ == "__main__":
        b = Batcher(2, AcceptsAnything, {"n_actions": 2}, counter_env, {"n_envs": 2},
                    n_processes=2, timeout=2.0)
        b.reset()
        os.kill(b._procs[1].pid, signal.SIGSTOP)   # a debugger, a cgroup freezer
        big = torch.zeros(2_000_000)  # 8 MB: more than a pipe holds
        # A state_dict goes through shared memory: update() returns at once...
        start = time.monotonic()
        b.update({"w": big})
        print("state_dict", f"{time.monotonic() - start:.2f}", flush=True)
        # ...and the frozen worker is named at the next get, after the batcher's timeout.
        b.execute()
        start = time.monotonic()
        try:
            b.get()
            print("no error")
        except WorkerTimeoutError as e:
            print("get", e.worker, f"{time.monotonic() - start:.2f}", flush=True)
        b.close()
        # Anything else is pickled down the pipe: the send itself is bounded.
        b = Batcher(2, AcceptsAnything, {"n_actions": 2}, counter_env, {"n_envs": 2},
                    n_processes=2, timeout=2.0)
        os.kill(b._procs[1].pid, signal.SIGSTOP)
        start = time.monotonic()
        try:
            b.update({"w": big, "note": "not only tensors"})
            print("no error")
        except WorkerTimeoutError as e:
            print("pickled", e.worker, f"{time.monotonic() - start:.2f}", flush=True)
        start = time.monotonic()
        b.close()
        print("closed", f"{time.monotonic() - start:.2f}", flush=True)
"""


@pytest.mark.slow
def test_a_frozen_worker_never_blocks_update_and_is_named_within_the_timeout():
    done = run_script(FROZEN_UPDATE)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.strip().splitlines())
    assert float(lines["state_dict"]) < 1.0
    for key in ("get", "pickled"):
        worker, seconds = lines[key].split()
        assert worker == "1"
        assert 1.9 < float(seconds) < 4.0  # the batcher's timeout (2 s), not forever
    assert float(lines["closed"]) < 5.0


@pytest.mark.slow
def test_non_blocking_get_after_a_worker_died_returns_at_once():
    env_args = {"n_envs": 2, "auto_reset": True, "hang_at": (0, 1), "hang_seconds": 5}
    b = Batcher(4, DeterministicAgent, {"n_actions": 2}, counter_env, env_args, n_processes=2)
    try:
        b.reset()
        b.execute()  # both workers are busy for 5 s
        os.kill(b._procs[0].pid, signal.SIGKILL)
        b._procs[0].join(5)
        start = time.monotonic()
        with pytest.raises(WorkerError, match="worker 0 died"):
            b.get(blocking=False)
        assert time.monotonic() - start < 0.3  # no waiting for the busy worker 1 to stop
    finally:
        b.close()


# ---------------------------------------------------------------------------- close
def shm_mapped_bytes() -> int:
    """Bytes of torch shared-memory segments mapped into this process."""
    total = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/dev/shm/torch_" in line:
                start, end = line.split()[0].split("-")
                total += int(end, 16) - int(start, 16)
    return total


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc (Linux)")
def test_close_frees_the_shared_buffer_while_the_batcher_object_lives():
    before = shm_mapped_bytes()
    b = Batcher(
        5000, DeterministicAgent, {"n_actions": 2}, counter_env, {"n_envs": 4}, n_processes=2
    )
    held = shm_mapped_bytes() - before
    assert held > 2_000_000  # 8 rows x 5000 steps of counter observations
    b.reset()
    b.execute()
    batch, _ = b.get()
    b.close()
    assert shm_mapped_bytes() - before < held / 10
    assert batch.trajectories["observation/frame"].sum() >= 0  # the batch is a copy: still valid


class HelperOwningEnv(gym.Wrapper):
    """CartPole that owns a helper process (like envs wrapping a simulator), released by close.

    The env of worker 1 fails at its ``fail_at``-th step; the others sleep at every step so
    their worker is busy in a segment when that happens.
    """

    def __init__(self, helper_dir: str, fail_at: int | None, sleep_s: float) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.helper = subprocess.Popen(["sleep", "120"])
        Path(helper_dir, str(self.helper.pid)).touch()
        self.fail_at, self.sleep_s, self.t = fail_at, sleep_s, 0

    def step(self, action):
        self.t += 1
        if self.t == self.fail_at:
            raise RuntimeError("simulator crashed")
        time.sleep(self.sleep_s)
        return self.env.step(action)

    def close(self):
        self.helper.kill()
        self.helper.wait()
        super().close()


def helper_env(n_envs: int, seed: int, helper_dir: str) -> GymEnvInf:
    worker = seed // n_envs  # run seed 0: worker p's envs start at seed p * n_envs
    fail_at, sleep_s = (3, 0.0) if worker == 1 else (None, 0.05)
    return GymEnvInf(
        [lambda: HelperOwningEnv(helper_dir, fail_at, sleep_s) for _ in range(n_envs)], seed=seed
    )




@pytest.mark.slow
def test_a_failure_closes_the_healthy_workers_envs(tmp_path):
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    try:
        b = Batcher(
            100, DeterministicAgent, {"n_actions": 2}, helper_env,
            {"n_envs": 3, "helper_dir": str(helpers)}, n_processes=3,
        )
        b.reset()
        b.execute()
        with pytest.raises(WorkerError, match="simulator crashed"):
            b.get()
        start = time.monotonic()
        b.close()
        assert time.monotonic() - start < 5.0
        pids = [int(p.name) for p in helpers.iterdir()]
        assert len(pids) == 9 + 3  # 3 workers x 3 envs, and the probe's 3 (closed at once)
        time.sleep(0.2)
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        assert not alive, f"helper processes left behind by envs never closed: {alive}"
    finally:
        for p in helpers.iterdir():
            with_group_killed_pid(int(p.name))


def with_group_killed_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)

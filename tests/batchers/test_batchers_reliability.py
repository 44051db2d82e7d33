"""Fault injection (RELIABILITY.md R01, R03, R04, R06, R09-R12, R14, R21).

Faults follow a fixed schedule: the env seeded ``fault_seed`` misbehaves at its ``at_step``-th
step call. With run seed ``s``, global env ``g`` has seed ``s * 2**20 + g``; with 2 workers of 4
envs, global env 7 is env 3 of worker 1.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch
from support import batcher_helpers
from support.agents import DeterministicAgent
from support.batcher_helpers import counter_env
from support.processes import children

from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.batchers.seeding import SEED_BLOCK
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.faults import faulty_gym_env
from rlstruct.errors import BatcherStateError, ConfigError, WorkerError, WorkerTimeoutError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

RUN_SEED = 2
REPO = Path(__file__).resolve().parents[2]


class CartPoleAgent(Agent):
    """Alternates actions 0/1 by env step: deterministic and keeps CartPole alive a while."""

    def __call__(self, state, observation, agent_info):
        from rlstruct.dicttensor import DictTensor

        return DictTensor({"action": observation["env_step"] % 2}), state




def shm_entries() -> set[str]:
    path = Path("/dev/shm")
    return set(os.listdir(path)) if path.exists() else set()


def faulty_batcher(fault: str, worker: int, env: int, at_step: int, **kw) -> Batcher:
    n_envs = 4
    env_args = {
        "env_id": "CartPole-v1",
        "n_envs": n_envs,
        "fault": fault,
        "auto_reset": True,
        "fault_seed": RUN_SEED * SEED_BLOCK + worker * n_envs + env,
        "at_step": at_step,
        **kw.pop("env_args", {}),
    }
    return Batcher(
        kw.pop("n_timesteps", 10),
        CartPoleAgent,
        {},
        faulty_gym_env,
        env_args,
        n_processes=2,
        seeds=RUN_SEED,
        **kw,
    )


def assert_all_stopped(batcher: Batcher, within: float = 2.0) -> None:
    deadline = time.monotonic() + within
    while any(p.is_alive() for p in batcher._procs if p._popen is not None):
        assert time.monotonic() < deadline, "workers still alive"
        time.sleep(0.02)


def test_r01_env_exception_names_worker_env_step():
    b = faulty_batcher("raise", worker=1, env=3, at_step=7)
    b.reset()
    b.execute()
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        b.get()
    assert time.monotonic() - start < 2.0
    err = info.value
    assert (err.worker, err.env, err.step, err.exc_type) == (1, 7, 7, "InjectedFaultError")
    assert "worker 1, env 7, step 7" in str(err)
    assert "injected fault" in str(err) and "Remote traceback" in str(err)
    assert "faults.py" in err.remote_traceback
    assert_all_stopped(b)
    with pytest.raises(BatcherStateError, match="failed earlier"):
        b.execute()
    b.close()  # close after a failure is fine


def test_r01_agent_exception():
    class Boom(Agent):
        def __call__(self, state, observation, agent_info):
            from rlstruct.dicttensor import DictTensor

            if int(observation["env_step"].max()) >= 3:
                raise ZeroDivisionError("agent bug")
            return DictTensor({"action": observation["env_step"] % 2}), state

    with Batcher(6, Boom, {}, batcher_helpers.cartpole_env, {"n_envs": 2}, n_processes=2) as b:
        b.reset()
        b.execute()
        with pytest.raises(WorkerError, match=r"step 3 during agent call: ZeroDivisionError"):
            b.get()


def test_r03_failing_env_factory_raises_from_constructor():
    before = len(children())
    start = time.monotonic()
    with pytest.raises(
        WorkerError, match=r"worker 1 during env factory: InjectedFaultError"
    ) as info:
        faulty_batcher("raise", worker=1, env=0, at_step=0, env_args={"factory_fails": True})
    assert info.value.worker == 1
    assert time.monotonic() - start < 10
    time.sleep(0.1)
    assert len(children()) <= before


def test_r03_failing_agent_factory():
    def create_agent():
        raise RuntimeError("no agent today")

    # The probe in the calling process raises first, before any worker starts.
    with pytest.raises(RuntimeError, match="no agent today"):
        Batcher(2, create_agent, {}, counter_env, {"n_envs": 2}, n_processes=2)
    assert not children()


@pytest.mark.parametrize("fault", ["kill", "exit"])
def test_r04_dead_worker_is_reported_fast(fault):
    b = faulty_batcher(fault, worker=0, env=1, at_step=3)
    b.reset()
    b.execute()
    start = time.monotonic()
    with pytest.raises(WorkerError, match="worker 0 died during execute") as info:
        b.get()
    assert time.monotonic() - start < 2.0
    assert info.value.exitcode == (-signal.SIGKILL if fault == "kill" else 3)
    assert_all_stopped(b)


def test_r06_hung_worker_trips_the_timeout_and_close_is_bounded():
    b = faulty_batcher("hang", worker=1, env=2, at_step=2, timeout=1.0)
    b.reset()
    b.execute()
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match=r"workers \[1\]") as info:
        b.get()
    assert time.monotonic() - start < 1.0 + 1.0 + 2.5  # timeout + 1 s, plus the bounded close
    assert info.value.worker == 1
    assert_all_stopped(b, within=0.5)


def test_r12_close_is_idempotent_and_bounded_with_a_hung_worker():
    b = faulty_batcher("hang", worker=0, env=0, at_step=1)
    b.reset()
    b.execute()
    time.sleep(0.3)
    procs = [psutil.Process(p.pid) for p in b._procs]
    start = time.monotonic()
    b.close()
    b.close()
    assert time.monotonic() - start < 5.0
    _gone, alive = psutil.wait_procs(procs, timeout=0.1)
    assert not alive


class BrokenStrError(Exception):
    """An exception that cannot describe itself."""

    def __str__(self) -> str:
        raise ValueError("no description today")


class BrokenStrAgent(Agent):
    """Raises BrokenStrError from its second call on (the batcher's probe calls it once)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, state, observation, agent_info):
        self.calls += 1
        if self.calls > 1:
            raise BrokenStrError()
        n = observation["frame"].shape[0]
        return DictTensor({"action": torch.zeros(n, dtype=torch.long)}), state


def test_r01_an_exception_whose_str_raises_is_still_reported():
    b = Batcher(2, BrokenStrAgent, {}, counter_env, {"n_envs": 2}, n_processes=1)
    with b:
        b.reset()
        b.execute()
        with pytest.raises(WorkerError) as info:
            b.get()
    err = info.value
    assert err.exc_type == "BrokenStrError" and err.worker == 0 and err.step == 1
    assert err.exitcode is None  # reported by the worker, not a death
    assert "BrokenStrError" in str(err) and "BrokenStrAgent" not in str(err.exc_type)
    assert "__call__" in err.remote_traceback


def test_r12_close_after_a_worker_died():
    b = faulty_batcher("exit", worker=1, env=0, at_step=0)
    b.reset()
    b.execute()
    b._procs[1].join(5)
    start = time.monotonic()
    b.close()
    b.close()
    assert time.monotonic() - start < 5.0


def test_r12_batcher_dropped_without_close():
    b = Batcher(2, DeterministicAgent, {"n_actions": 2}, counter_env, {"n_envs": 2}, n_processes=2)
    b.reset()
    procs = [psutil.Process(p.pid) for p in b._procs]
    del b
    gc.collect()
    _gone, alive = psutil.wait_procs(procs, timeout=5)
    assert not alive


def test_r11_create_get_close_cycles_leak_nothing():
    """R11: no process, zombie, /dev/shm entry or fd accumulates over create/get/close cycles."""
    cycles = int(os.environ.get("RLSTRUCT_R11_CYCLES", "100"))
    me = psutil.Process()

    def cycle():
        with Batcher(
            3,
            DeterministicAgent,
            {"n_actions": 2},
            counter_env,
            {"n_envs": 2, "auto_reset": True},
            n_processes=1,
            start_timeout=60,
        ) as b:
            b.reset()
            b.execute()
            b.get()

    cycle()  # warm-up: lazily created helpers (resource sharer thread) exist from here on
    fds, shm, rss = me.num_fds(), shm_entries(), me.memory_info().rss
    for _ in range(cycles):
        cycle()
    gc.collect()
    assert not children(), "leaked (or zombie) worker processes"
    assert me.num_fds() - fds <= 2
    assert shm_entries() <= shm
    assert me.memory_info().rss - rss < 50 * 2**20


def test_r14_unpicklable_factory_fails_before_spawning():
    import threading

    lock = threading.Lock()

    def create_env(n_envs, seed):
        with lock:
            return counter_env(n_envs, seed)

    with pytest.raises(TypeError, match="create_env cannot be sent to a worker"):
        Batcher(2, DeterministicAgent, {"n_actions": 2}, create_env, {"n_envs": 2})
    assert not children()


def test_r21_bad_config_lists_every_field_before_any_process():
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        Batcher(
            0,
            DeterministicAgent,
            {},
            counter_env,
            {"n_envs": 2, "seed": 3},
            n_processes=0,
            seeds=[1, 2, 3],
            device="meta",
            n_threads=0,
        )
    assert time.monotonic() - start < 0.1
    message = str(info.value)
    for field in ("n_timesteps", "n_processes", "'seed'", "device", "n_threads"):
        assert field in message
    assert not children()


def test_cuda_or_wrong_device_args_are_refused_before_spawning():
    model = torch.nn.Linear(2, 2, device="meta")
    with pytest.raises(ConfigError, match=r"agent_args\['model'\].*SerialBatcher"):
        Batcher(2, DeterministicAgent, {"model": model}, counter_env, {"n_envs": 2})
    with pytest.raises(ConfigError, match=r"CPU-only.*SerialBatcher"):
        Batcher(2, DeterministicAgent, {}, counter_env, {"n_envs": 2}, device="cuda")
    assert not children()


def run_script(code: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_r09_workers_exit_when_the_main_process_is_killed():
    proc = run_script("""
        import os, signal
        from support.agents import DeterministicAgent
        from support.batcher_helpers import counter_env
        from rlstruct.batchers import Batcher
        if __name__ == "__main__":
            b = Batcher(2, DeterministicAgent, {"n_actions": 2}, counter_env, {"n_envs": 2},
                        n_processes=2)
            b.reset()
            print(" ".join(str(p.pid) for p in b._procs), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    out, err = proc.communicate(timeout=60)
    pids = [int(x) for x in out.split()]
    assert len(pids) == 2, err
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
        assert time.monotonic() < deadline, "workers outlived their parent"
        time.sleep(0.05)


@pytest.mark.slow
def test_r09_a_worker_stuck_in_env_step_exits_with_its_forkserver_when_the_driver_is_killed():
    # A forkserver's child holds the forkserver's "alive" pipe: without a watchdog in the
    # worker, the forkserver (the worker's parent, whose death would SIGKILL it) outlives the
    # driver, and so do the worker stuck in env.step and the resource tracker.
    proc = run_script("""
        import os, signal, time
        from multiprocessing import forkserver, resource_tracker
        from support.agents import DeterministicAgent
        from support.batcher_helpers import counter_env
        from rlstruct.batchers import Batcher
        if __name__ == "__main__":
            env_args = {"n_envs": 1, "auto_reset": True, "hang_at": (0, 1), "hang_seconds": 60}
            b = Batcher(3, DeterministicAgent, {"n_actions": 2}, counter_env, env_args,
                        n_processes=1)
            b.reset()
            b.execute()
            time.sleep(0.3)  # the worker is in its hanging env.step
            helpers = [forkserver._forkserver._forkserver_pid,
                       resource_tracker._resource_tracker._pid]
            print(" ".join(str(p) for p in [*(p.pid for p in b._procs), *helpers]), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """, start_new_session=True)
    pids = [int(x) for x in proc.stdout.readline().split()]  # the children keep stdout open
    proc.wait(timeout=60)
    assert len(pids) == 3, pids
    try:
        deadline = time.monotonic() + 5
        while alive := [p for p in pids if psutil.pid_exists(p)
                        and psutil.Process(p).status() != "zombie"]:
            assert time.monotonic() < deadline, f"{alive} (worker, forkserver, tracker) lived on"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_workers_do_not_import_rlstruct_from_the_working_directory(tmp_path):
    # A folder named rlstruct where the program runs (a clone's parent, ~/rlstruct): the
    # forkserver is started with `python -c`, which puts the working directory first on its
    # sys.path. Its preload imported that folder as the package `rlstruct`, and every worker
    # forked from it failed to run the script again: "cannot import name 'Batcher' from
    # 'rlstruct'". (An empty package here stands for a folder without __init__.py, a namespace
    # package, which shadows an editable install the same way.)
    here = tmp_path / "here"
    (here / "rlstruct").mkdir(parents=True)
    (here / "rlstruct" / "__init__.py").write_text("")
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent("""
        from rlstruct import Batcher  # what the worker runs again to unpickle ScriptAgent
        from support.agents import DeterministicAgent
        from support.batcher_helpers import counter_env

        class ScriptAgent(DeterministicAgent):
            pass

        if __name__ == "__main__":
            b = Batcher(2, ScriptAgent, {"n_actions": 2}, counter_env, {"n_envs": 1},
                        n_processes=1)
            try:
                b.reset()
                b.execute()
                print("collected", b.get() is not None, flush=True)
            finally:
                b.close()
    """))
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    env.pop("PYTHONSAFEPATH", None)
    done = subprocess.run([sys.executable, str(script)], cwd=here, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "collected True" in done.stdout, done.stderr[-2000:]


def test_r10_sigint_during_get_closes_cleanly():
    # Ctrl-C in an interactive program: SIGINT raises KeyboardInterrupt. A job a shell started
    # in the background (`make test &`) inherits SIGINT ignored, so the script restores it.
    proc = run_script("""
        import signal, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from support.agents import DeterministicAgent
        from support.batcher_helpers import counter_env
        from rlstruct.batchers import Batcher
        if __name__ == "__main__":
            env_args = {"n_envs": 2, "auto_reset": True, "hang_at": (0, 1), "hang_seconds": 30}
            b = Batcher(3, DeterministicAgent, {"n_actions": 2}, counter_env, env_args,
                        n_processes=2)
            b.reset()
            b.execute()
            print("ready", flush=True)
            try:
                b.get()
            except KeyboardInterrupt:
                start = time.monotonic()
                b.close()
                print(f"closed {time.monotonic() - start:.2f}", flush=True)
    """)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert out.startswith("closed"), err
    assert float(out.split()[1]) < 5.0
    assert "KeyboardInterrupt" not in err  # no worker tracebacks
    assert "Traceback" not in err


def test_r14_missing_main_guard_fails_fast_with_a_hint(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent("""
        from support.agents import DeterministicAgent
        from support.batcher_helpers import counter_env
        from rlstruct.batchers import Batcher
        b = Batcher(2, DeterministicAgent, {"n_actions": 2}, counter_env, {"n_envs": 2},
                    n_processes=1, start_timeout=30)
        b.close()
    """)
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "__main__" in done.stderr and "WorkerError" in done.stderr
    assert time.monotonic() - start < 30


@pytest.mark.parametrize(
    ("how", "error", "match"),
    [
        (
            "dtype",
            "ShapeError",
            r"worker 0, step 2: action/extra is \(2,\) torch.float64, "
            r"expected \(2,\) torch.float32 \(no silent cast\)",
        ),
        ("key", "KeyMismatchError", r"worker 0, step 2: action has keys \['action', 'extra', "),
        ("rows", "ShapeError", r"step 2: the agent returned 3 action rows for 2 running envs"),
    ],
)
def test_r18_agent_output_drift_is_caught_at_the_step(how, error, match):
    args = {"at": 2, "how": how}
    with (
        pytest.raises(Exception, match=match) as serial,
        SerialBatcher(
            5, batcher_helpers.DriftingAgent, args, counter_env, {"n_envs": 2, "auto_reset": True}
        ) as b,
    ):
        b.reset()
        b.execute()
    assert type(serial.value).__name__ == error
    with Batcher(
        5,
        batcher_helpers.DriftingAgent,
        args,
        counter_env,
        {"n_envs": 2, "auto_reset": True},
        n_processes=1,
    ) as b:
        b.reset()
        b.execute()
        with pytest.raises(WorkerError, match=match) as multi:
            b.get()
    assert multi.value.exc_type == error and multi.value.step == 2


def test_bad_update_is_reported_at_the_next_get():
    with Batcher(
        2,
        batcher_helpers.GreedyMLPAgent,
        {"n_actions": 3},
        counter_env,
        {"n_envs": 2, "n_actions": 3},
        n_processes=2,
    ) as b:
        b.reset()
        b.update({"weight": torch.zeros(1)})  # returns at once: the workers load it later
        b.execute()
        bad_load = r"(?s)during agent update.*(size mismatch|Missing key)"
        with pytest.raises(WorkerError, match=bad_load):
            b.get()


def test_r03_failing_env_reset_in_a_worker():
    b = faulty_batcher("raise_in_reset", worker=1, env=2, at_step=0)
    with pytest.raises(WorkerError, match="worker 1, env 6 during env reset: InjectedFaultError"):
        b.reset()
    assert_all_stopped(b)


def test_r06_hung_agent_trips_the_timeout():
    b = Batcher(
        4,
        batcher_helpers.SleepyAgent,
        {"at": 1},
        counter_env,
        {"n_envs": 2, "auto_reset": True},
        n_processes=2,
        timeout=1.0,
    )
    b.reset()
    b.execute()
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match=r"workers \[0, 1\]"):
        b.get()
    assert time.monotonic() - start < 1.0 + 1.0 + 2.5
    assert_all_stopped(b, within=0.5)


def test_r13_many_gets_under_a_low_fd_limit():
    """R13: 10 000 execute/get round trips with ulimit -n 256: fd and /dev/shm counts stay flat."""
    n_gets = int(os.environ.get("RLSTRUCT_R13_GETS", "10000"))
    proc = run_script(f"""
        import os, resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        from support.agents import DeterministicAgent
        from support.batcher_helpers import counter_env
        from rlstruct.batchers import Batcher
        if __name__ == "__main__":
            with Batcher(1, DeterministicAgent, {{"n_actions": 2}}, counter_env,
                         {{"n_envs": 2, "auto_reset": True}}, n_processes=1) as b:
                b.reset()
                fds, shm = [], []
                for i in range({n_gets}):
                    b.execute()
                    b.get()
                    if i in (10, {n_gets} - 1):
                        fds.append(len(os.listdir("/proc/self/fd")))
                        shm.append(len(os.listdir("/dev/shm")))
            print(fds[0], fds[1], shm[0], shm[1], flush=True)
    """)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "Errno 24" not in err
    fd_start, fd_end, shm_start, shm_end = (int(x) for x in out.split())
    assert fd_end <= fd_start + 2
    assert shm_end <= shm_start

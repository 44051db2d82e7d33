"""Collection throughput: rlstruct batchers vs gymnasium vector envs and TorchRL collectors.

Workload (BENCHMARKS.md): CartPole-v1; policy MLP 4->64->64->2 (tanh), actions sampled from the
softmax (``torch.multinomial``; the same function for every setup), under ``torch.no_grad()``;
one torch thread per process and ``OMP_NUM_THREADS=1`` everywhere. 64 envs in all, collected in
batches of ``T`` vector steps (``n_timesteps=T`` for rlstruct; ``T`` steps of the vector env,
``frames_per_batch=64*T`` for TorchRL).

Rows (all measured in the same run):

1. raw ``gym.make("CartPole-v1")`` loop, one env, random actions, no policy (reference only);
2. gymnasium ``SyncVectorEnv(64)`` + the batched MLP, one process;
3. gymnasium ``AsyncVectorEnv`` over 2 processes, each stepping a ``SyncVectorEnv(32)``: as
   ``AsyncVectorEnv`` only takes single envs, each worker runs ``SyncBlockEnv``, a ``gym.Env``
   that wraps a ``SyncVectorEnv(32)`` and exposes its batched spaces (observation, reward and
   done flags travel in a Dict observation through gymnasium's shared memory; the outer env
   sees a scalar reward and never-ending episodes, the inner one auto-resets). The MLP runs on
   the ``(64, 4)`` batch in the main process;
4. TorchRL ``MultiSyncCollector``, 2 workers x ``SerialEnv(32)`` of ``GymEnv("CartPole-v1")``
   (the row says "not installed" without torchrl);
5. rlstruct ``SerialBatcher`` over ``GymEnvInf(64)``;
6. rlstruct ``Batcher``, 2 processes x ``GymEnvInf(32)``;
5b, 6b. rows 5 and 6 with ``GymEnvInf(..., check_obs=False)``: without the check that refuses
   NaN and infinite observations at every step (``ObservationError``); the "observation check
   cost" lines give the ratio of rows 5 and 6 to them (the check's cost: 1 - ratio);
7. rlstruct ``Batcher`` start-up time (2 workers) and buffer bytes per transition.

Method: every setup lives in its own *runner* process (this script with ``--runner``), so that
its CPU use and memory are those of its own process tree. The runners are built and warmed up
(construction and the first batches are excluded), then the repetitions are interleaved: rep
``r`` runs every setup once, in an order rotated by ``r``, while the other runners sleep on their
pipes. A rep collects whole batches for at least ``--min-time`` seconds. Per rep a runner
reports env transitions (gymnasium's next-step auto-reset calls are not counted as
transitions), wall time, CPU seconds of its tree (psutil) and the tree's peak RSS (per-process
VmHWM, reset at the start of the rep). The summary prints median (min-max) steps/s, and the
ratios of medians against the targets below, with the range of the per-rep paired ratios.
``steps/CPU-s`` (transitions per CPU second of the tree) is the column that busy neighbours
disturb least. ``--quick`` (T=16, 3 reps of 0.05 s) hosts every setup but TorchRL in one runner
and takes the start-up figure from the first construction: it checks that everything runs, its
numbers mean little.

Targets (BENCHMARKS.md): SerialBatcher >= 0.9x row 2; Batcher >= 1.5x row 2, >= 1.75x row 3
and >= 10x row 4; Batcher start-up (2 workers): the program's first <= 3 s (constructor and
reset, in the runner's first construction, beside the other runners' builds), later ones
(constructor) <= 0.5 s.

A full run then runs ``benchmarks/pipeline.py`` (shared-memory ``update`` of a 50M-parameter
state_dict; pipelined vs synchronous ``Batcher`` with a fake learner), in the same run.

Usage::

    python benchmarks/throughput.py                  # full run (~3 min on 2 cores)
    python benchmarks/throughput.py --quick          # smoke run (~15 s, TorchRL's start-up)
    python benchmarks/throughput.py --reps 7 --json out.json
"""

from __future__ import annotations

import os

# One thread per process, before torch starts its pool; runners and workers inherit it.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import contextlib
import importlib.util
import json
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common
import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlstruct import DictTensor
from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.envs.gym import GymEnvInf

ENV_ID = "CartPole-v1"
N_ENVS = 64  # in all, for every vectorised setup
N_PROCS = 2  # worker processes of the multi-process setups

#: (numerator, denominator, minimum ratio of median steps/s)
TARGETS: list[tuple[str, str, float]] = [
    ("rl_serial", "gym_sync", 0.9),
    ("rl_batcher", "gym_sync", 1.5),
    ("rl_batcher", "gym_async", 1.75),
    ("rl_batcher", "torchrl", 10.0),
]
MAX_STARTUP_S = 3.0  # the first Batcher of a program (the forkserver imports torch once)
MAX_LATER_STARTUP_S = 0.5  # every later Batcher of the same program
PIPELINE_TIMEOUT_S = 900.0  # the pipelined-collection section (benchmarks/pipeline.py)

#: key -> (row number, label)
ROWS: dict[str, tuple[int, str]] = {
    "raw": (1, "gym.make CartPole, 1 env, random actions (ref)"),
    "gym_sync": (2, "gymnasium SyncVectorEnv(64) + MLP"),
    "gym_async": (3, "gymnasium Async(2 procs x SyncVectorEnv(32))"),
    "torchrl": (4, "TorchRL MultiSyncCollector(2 x SerialEnv(32))"),
    "rl_serial": (5, "rlstruct SerialBatcher(GymEnvInf(64))"),
    "rl_batcher": (6, "rlstruct Batcher(2 procs x GymEnvInf(32))"),
    "rl_serial_nocheck": ("5b", "  row 5 with check_obs=False"),
    "rl_batcher_nocheck": ("6b", "  row 6 with check_obs=False"),
}

#: (with the observation check, without it): the check's cost is 1 - the ratio of medians.
CHECK_COSTS: list[tuple[str, str]] = [
    ("rl_serial", "rl_serial_nocheck"),
    ("rl_batcher", "rl_batcher_nocheck"),
]
MAX_CHECK_COST = 0.02  # what "negligible" means here: at most 2% of the steps/s


# ------------------------------------------------------------------------------ the policy
def make_mlp(seed: int = 0) -> nn.Module:
    """The reference policy: MLP 4 -> 64 -> 64 -> 2 with tanh, returning logits."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    mlp = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    torch.random.set_rng_state(gen_state)
    return mlp


def sample_actions(logits: torch.Tensor) -> torch.Tensor:
    """One action per row, sampled from the softmax of the logits (int64, shape ``(n,)``)."""
    return torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(-1)


class MLPAgent(Agent):
    """The reference policy as an rlstruct agent (memoryless)."""

    def __init__(self, seed: int = 0) -> None:
        self.model = make_mlp(seed)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def __call__(self, state, observation, agent_info):
        action = sample_actions(self.model(observation["frame"]))
        return DictTensor({"action": action}), state


class PolicyNet(nn.Module):
    """The reference policy as one module (for TorchRL): observation -> sampled action."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = make_mlp()

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return sample_actions(self.mlp(observation))


# ------------------------------------------------------------------------------ env factories
def make_cartpole() -> gym.Env:
    return gym.make(ENV_ID)


class SyncBlockEnv(gym.Env):
    """``n`` CartPoles stepped by a ``SyncVectorEnv`` inside ONE ``gym.Env`` (for nesting).

    The observation is a Dict with the batched observation and the per-env reward,
    ``terminated`` and ``truncated``; ``step`` returns a scalar reward of 0 and never ends, so
    the outer ``AsyncVectorEnv`` never resets it (the inner vector env auto-resets each env).
    """

    def __init__(self, n: int) -> None:
        self.vec = gym.vector.SyncVectorEnv([make_cartpole] * n, copy=False)
        self.n = n
        self.observation_space = gym.spaces.Dict({
            "obs": self.vec.observation_space,
            "reward": gym.spaces.Box(-np.inf, np.inf, (n,), np.float32),
            "terminated": gym.spaces.MultiBinary(n),
            "truncated": gym.spaces.MultiBinary(n),
        })
        self.action_space = self.vec.action_space

    def _pack(self, obs, reward, terminated, truncated) -> dict[str, np.ndarray]:
        return {"obs": obs, "reward": reward.astype(np.float32),
                "terminated": terminated.astype(np.int8), "truncated": truncated.astype(np.int8)}

    def reset(self, *, seed=None, options=None):
        obs, _ = self.vec.reset(seed=seed)
        zeros = np.zeros(self.n, np.int8)
        return self._pack(obs, np.zeros(self.n, np.float32), zeros, zeros), {}

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.vec.step(action)
        return self._pack(obs, reward, terminated, truncated), 0.0, False, False, {}

    def close(self) -> None:
        self.vec.close()


def make_sync_block_32() -> gym.Env:
    return SyncBlockEnv(N_ENVS // N_PROCS)


def make_torchrl_cartpole():
    from torchrl.envs.libs.gym import GymEnv as TorchRLGymEnv

    return TorchRLGymEnv(ENV_ID, categorical_action_encoding=True, device="cpu")


def make_torchrl_serial_env():
    from torchrl.envs import SerialEnv

    return SerialEnv(N_ENVS // N_PROCS, make_torchrl_cartpole)


# ------------------------------------------------------------------------------ setups
# A setup is built in its runner process; ``batch()`` collects one batch and returns the number
# of env transitions it holds.
class RawLoop:
    """Row 1: one env, random actions, reset at episode ends; no policy."""

    def __init__(self, cfg: dict) -> None:
        self.env = make_cartpole()
        self.env.reset(seed=0)
        self.env.action_space.seed(0)
        self.steps = cfg["T"] * N_ENVS

    def batch(self) -> int:
        env, sample = self.env, self.env.action_space.sample
        for _ in range(self.steps):
            _, _, terminated, truncated, _ = env.step(sample())
            if terminated or truncated:
                env.reset()
        return self.steps

    def close(self) -> None:
        self.env.close()


class GymSync:
    """Row 2: ``SyncVectorEnv(64)`` and the batched MLP in one process."""

    def __init__(self, cfg: dict) -> None:
        self.T = cfg["T"]
        self.envs = gym.vector.SyncVectorEnv([make_cartpole] * N_ENVS, copy=False)
        self.obs, _ = self.envs.reset(seed=0)
        self.model = make_mlp()
        self.resetting = np.zeros(N_ENVS, bool)  # next-step auto-reset: not a transition

    def batch(self) -> int:
        steps, obs, model, envs = 0, self.obs, self.model, self.envs
        with torch.no_grad():
            for _ in range(self.T):
                actions = sample_actions(model(torch.from_numpy(obs))).numpy()
                steps += N_ENVS - int(self.resetting.sum())
                obs, _, terminated, truncated, _ = envs.step(actions)
                self.resetting = terminated | truncated
        self.obs = obs
        return steps

    def close(self) -> None:
        self.envs.close()


class GymAsyncNested:
    """Row 3: ``AsyncVectorEnv`` of 2 ``SyncBlockEnv(32)``; the MLP in the main process."""

    def __init__(self, cfg: dict) -> None:
        self.T = cfg["T"]
        self.envs = gym.vector.AsyncVectorEnv(
            [make_sync_block_32] * N_PROCS, shared_memory=True, copy=False
        )
        out, _ = self.envs.reset(seed=[0, N_ENVS // N_PROCS])
        self.obs = out["obs"].reshape(N_ENVS, -1)
        self.model = make_mlp()
        self.resetting = np.zeros(N_ENVS, bool)

    def batch(self) -> int:
        steps, obs, model, envs = 0, self.obs, self.model, self.envs
        with torch.no_grad():
            for _ in range(self.T):
                actions = sample_actions(model(torch.from_numpy(obs))).numpy()
                steps += N_ENVS - int(self.resetting.sum())
                out, _, _, _, _ = envs.step(actions.reshape(N_PROCS, -1))
                obs = out["obs"].reshape(N_ENVS, -1)
                self.resetting = (out["terminated"] | out["truncated"]).reshape(-1).astype(bool)
        self.obs = obs
        return steps

    def close(self) -> None:
        self.envs.close()


class TorchRLMultiSync:
    """Row 4: TorchRL ``MultiSyncCollector``, 2 workers x ``SerialEnv(32)``."""

    def __init__(self, cfg: dict) -> None:
        from tensordict.nn import TensorDictModule
        from torchrl.collectors import MultiSyncCollector

        policy = TensorDictModule(PolicyNet(), in_keys=["observation"], out_keys=["action"])
        self.collector = MultiSyncCollector(
            [make_torchrl_serial_env] * N_PROCS,
            policy,
            frames_per_batch=N_ENVS * cfg["T"],
            total_frames=-1,
            device="cpu",
            num_threads=1,
            num_sub_threads=1,
            cat_results="stack",
        )
        self.collector.set_seed(0)
        self.it = iter(self.collector)

    def batch(self) -> int:
        return int(next(self.it).numel())

    def close(self) -> None:
        self.collector.shutdown()


def _batcher(cfg: dict, check_obs: bool = True) -> Batcher:
    return Batcher(
        n_timesteps=cfg["T"], create_agent=MLPAgent, agent_args={}, create_env=GymEnvInf,
        env_args={"env": ENV_ID, "n_envs": N_ENVS // N_PROCS, "check_obs": check_obs},
        n_processes=N_PROCS, seeds=0, n_threads=1,
    )


class RLSerial:
    """Row 5: ``SerialBatcher`` over ``GymEnvInf(64)``."""

    check_obs = True  # GymEnvInf's check of NaN and infinite observations (row 5b: off)

    def __init__(self, cfg: dict) -> None:
        self.b = SerialBatcher(
            n_timesteps=cfg["T"], create_agent=MLPAgent, agent_args={}, create_env=GymEnvInf,
            env_args={"env": ENV_ID, "n_envs": N_ENVS, "check_obs": self.check_obs}, seeds=0,
        )
        self.b.reset()
        self.info = {"bytes_per_transition": self.b.buffer.bytes_per_transition()}

    def batch(self) -> int:
        self.b.execute()
        traj, _ = self.b.get()
        return int(traj.trajectories.lengths.sum())

    def close(self) -> None:
        self.b.close()


class RLBatcher(RLSerial):
    """Row 6: ``Batcher``, 2 processes x ``GymEnvInf(32)``; also measures start-up (row 7)."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.b = _batcher(cfg, self.check_obs)
        self.b.reset()
        self.info = {
            "bytes_per_transition": self.b.buffer.bytes_per_transition(),
            "startup_seconds_first": self.b.startup_seconds,
        }

    def startup(self) -> dict[str, float]:
        """Builds a fresh Batcher (2 workers), collects one batch, closes it; times each part."""
        t0 = time.perf_counter()
        b = _batcher(self.cfg)
        t1 = time.perf_counter()
        try:
            b.reset()
            b.execute()
            b.get()
            t2 = time.perf_counter()
        finally:
            b.close()
        t3 = time.perf_counter()
        return {"construct_s": t1 - t0, "workers_ready_s": b.startup_seconds,
                "first_batch_s": t2 - t1, "close_s": t3 - t2}


class RLSerialNoCheck(RLSerial):
    """Row 5b: row 5 without the observation check."""

    check_obs = False


class RLBatcherNoCheck(RLBatcher):
    """Row 6b: row 6 without the observation check."""

    check_obs = False


SETUPS: dict[str, Callable[[dict], Any]] = {
    "raw": RawLoop,
    "gym_sync": GymSync,
    "gym_async": GymAsyncNested,
    "torchrl": TorchRLMultiSync,
    "rl_serial": RLSerial,
    "rl_batcher": RLBatcher,
    "rl_serial_nocheck": RLSerialNoCheck,
    "rl_batcher_nocheck": RLBatcherNoCheck,
}


# ------------------------------------------------------------------------------ runner side
def _rep(setup: Any, meter: _common.TreeMeter, min_time: float) -> dict:
    steps = batches = 0
    meter.start()
    t0 = time.perf_counter()
    while True:
        steps += setup.batch()
        batches += 1
        if time.perf_counter() - t0 >= min_time:
            break
    w = meter.stop()
    return {"steps": steps, "batches": batches, **w.as_dict(),
            "steps_per_s": steps / w.wall_s}


def _error(e: BaseException, **extra: Any) -> dict:
    return {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(),
            **extra}


def runner_main(keys: list[str], cfg: dict) -> int:
    """Hosts the setups ``keys`` in this process: builds and warms up each (one reply per
    setup), then answers commands, one JSON object per line each way."""
    # The protocol owns the original stdout; anything else printed (here or by workers, which
    # inherit fd 1) goes to stderr.
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the orchestrator owns shutdown

    def reply(msg: dict) -> None:
        channel.write(json.dumps(msg) + "\n")

    torch.set_num_threads(1)
    setups: dict[str, Any] = {}
    for key in keys:
        try:
            t0 = time.perf_counter()
            setup = SETUPS[key](cfg)
            construct_s = time.perf_counter() - t0
            setups[key] = setup
            t0 = time.perf_counter()
            n = 0
            while n < cfg["warmup_batches"] or time.perf_counter() - t0 < cfg["warmup_s"]:
                setup.batch()  # the first batch (and a few more) are never timed
                n += 1
            reply({"ok": True, "key": key, "construct_s": construct_s, "warmup_batches": n,
                   "info": getattr(setup, "info", {}),
                   "torch_threads": torch.get_num_threads()})
        except Exception as e:  # noqa: BLE001 - the row's error goes back to the parent
            reply(_error(e, key=key))
    meter = _common.TreeMeter()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "close":
            break
        try:
            setup = setups[cmd["key"]]
            if cmd["cmd"] == "rep":
                reply({"ok": True, **_rep(setup, meter, cmd["min_time"])})
            elif cmd["cmd"] == "pss":
                reply({"ok": True, "pss_bytes": meter.pss_bytes()})
            elif cmd["cmd"] == "startup":
                reply({"ok": True, **setup.startup()})
        except Exception as e:  # noqa: BLE001 - the row's error goes back to the parent
            reply(_error(e, key=cmd.get("key")))
    for setup in setups.values():
        try:
            setup.close()
        except Exception:  # noqa: BLE001 - printed; closing the other setups goes on
            traceback.print_exc()
    reply({"ok": True})
    return 0


# ------------------------------------------------------------------------------ orchestrator
class RunnerError(RuntimeError):
    """The runner process is gone or silent (every setup it hosts is lost)."""


class SetupError(RuntimeError):
    """One setup failed; its runner goes on."""

    def __init__(self, message: str, key: str | None) -> None:
        super().__init__(message)
        self.key = key


class Runner:
    """A runner process seen from the orchestrator: JSON requests in, JSON replies out."""

    def __init__(self, keys: list[str], cfg: dict) -> None:
        self.keys = keys
        self.name = "+".join(keys)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--runner", ",".join(keys),
             "--runner-config", json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            start_new_session=True,  # its own process group: kill() reaches its workers too
        )
        self.replies: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.replies.put(json.loads(line))
            except json.JSONDecodeError:
                sys.stderr.write(line)
        self.replies.put(None)  # EOF: the runner exited

    def wait_reply(self, timeout: float) -> dict:
        """The next reply; SetupError if it reports a failure, RunnerError if none comes."""
        try:
            msg = self.replies.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise RunnerError(f"{self.name}: no answer within {timeout:.0f} s (killed)") from None
        if msg is None:
            raise RunnerError(f"runner {self.name} exited (code {self.proc.wait()})")
        if not msg.get("ok"):
            sys.stderr.write(msg.get("traceback", ""))
            raise SetupError(str(msg.get("error")), msg.get("key"))
        return msg

    def send(self, cmd: dict) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise RunnerError(f"runner {self.name} is gone") from None

    def request(self, cmd: dict, timeout: float) -> dict:
        self.send(cmd)
        return self.wait_reply(timeout)

    def finish(self, timeout: float = 30.0) -> None:
        """Waits for the runner to exit after a ``close`` command; kills what is left."""
        if self.proc.poll() is None:
            try:
                self.wait_reply(timeout)
                self.proc.wait(timeout)
            except (RunnerError, SetupError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        """Kills the runner's process group (the runner and the workers it started)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def _peer_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"gymnasium": gym.__version__}
    for pkg in ("torchrl", "tensordict"):
        try:
            out[pkg] = version(pkg) if importlib.util.find_spec(pkg) else "not installed"
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def run(quick: bool, reps: int | None, min_time: float | None, n_timesteps: int | None) -> dict:
    n_timesteps = n_timesteps if n_timesteps is not None else (16 if quick else 64)
    reps = reps if reps is not None else (3 if quick else 5)
    min_time = min_time if min_time is not None else (0.05 if quick else 1.5)
    cfg = {"T": n_timesteps, "warmup_batches": 1 if quick else 2, "warmup_s": 0.0 if quick else 0.5}
    startup_reps = 0 if quick else 3
    versions = _peer_versions()
    phases: dict[str, float] = {}
    t_phase = time.perf_counter()

    rows: dict[str, dict] = {}
    for key in SETUPS:
        number, label = ROWS[key]
        rows[key] = {"key": key, "row": number, "label": label, "status": "ok", "notes": []}
    if "not installed" in (versions["torchrl"], versions["tensordict"]):
        rows["torchrl"]["status"] = "not installed"
    keys = [k for k in SETUPS if rows[k]["status"] == "ok"]
    # One runner per setup, so that CPU and memory are each setup's own. --quick hosts every
    # setup but TorchRL in one runner: fewer interpreters importing torch at once.
    if quick:
        groups = [[k for k in keys if k != "torchrl"], [k for k in keys if k == "torchrl"]]
    else:
        groups = [[k] for k in keys]
    runner_of: dict[str, Runner] = {}
    runners = []
    for group in filter(None, groups):
        runners.append(Runner(group, cfg))
        runner_of.update(dict.fromkeys(group, runners[-1]))
        if len(group) > 1:
            for k in group:
                rows[k]["notes"].append(
                    "quick: one runner hosts " + ", ".join(group) + " (CPU and RSS are the "
                    "runner tree's, idle setups included)")

    def lost(r: Runner, error: Exception) -> None:
        for k in [k for k, v in runner_of.items() if v is r]:
            rows[k]["status"] = f"error: {error}"
            del runner_of[k]
        r.kill()

    startup: dict[str, Any] = {"status": "ok", "target_s": MAX_STARTUP_S}
    samples: dict[str, list[dict]] = {k: [] for k in keys}
    try:
        # Build and warm up every setup (runners concurrently: none of this is timed).
        for r in runners:
            for _ in r.keys:
                try:
                    msg = r.wait_reply(600)
                except SetupError as e:
                    if e.key in rows:
                        rows[e.key]["status"] = f"error: {e}"
                    continue
                except RunnerError as e:
                    lost(r, e)
                    break
                key = msg["key"]
                rows[key]["construct_s"] = msg["construct_s"]
                rows[key]["runner_torch_threads"] = msg["torch_threads"]
                rows[key].update(msg["info"])
                rows[key]["built"] = True
        for key in list(runner_of):
            if not rows[key].pop("built", False):
                if rows[key]["status"] == "ok":
                    rows[key]["status"] = "error: failed to build (see stderr)"
                del runner_of[key]
        phases["build_and_warm_up"] = time.perf_counter() - t_phase
        t_phase = time.perf_counter()

        # Row 7: start-up of a fresh Batcher while every other setup sleeps (--quick: the
        # first construction, which ran beside the other setups' construction).
        if "rl_batcher" not in runner_of:
            startup["status"] = rows["rl_batcher"]["status"]
        elif startup_reps == 0:
            row = rows["rl_batcher"]
            startup["construct_s"] = _common.summarize([row["construct_s"]])
            startup["workers_ready_s"] = _common.summarize([row["startup_seconds_first"]])
            startup["note"] = "quick: the first construction, beside the other setups' builds"
        else:
            try:
                r = runner_of["rl_batcher"]
                ups = [r.request({"cmd": "startup", "key": "rl_batcher"}, 300)
                       for _ in range(startup_reps)]
                for k in ("construct_s", "workers_ready_s", "first_batch_s", "close_s"):
                    startup[k] = _common.summarize(u[k] for u in ups)
            except SetupError as e:
                startup["status"] = f"error: {e}"
            except RunnerError as e:
                startup["status"] = f"error: {e}"
                lost(r, e)
        phases["startup"] = time.perf_counter() - t_phase
        t_phase = time.perf_counter()

        # Interleaved repetitions, the order rotated every rep.
        for rep in range(reps):
            order = keys[rep % len(keys):] + keys[: rep % len(keys)]
            for key in order:
                if key not in runner_of:
                    continue
                r = runner_of[key]
                try:
                    samples[key].append(r.request(
                        {"cmd": "rep", "key": key, "min_time": min_time},
                        max(120.0, 30 * min_time)))
                except SetupError as e:
                    rows[key]["status"] = f"error: {e}"
                    del runner_of[key]
                except RunnerError as e:
                    lost(r, e)
        for key, r in list(runner_of.items()):
            try:
                pss = r.request({"cmd": "pss", "key": key}, 60)["pss_bytes"]
                rows[key]["pss_mb"] = None if pss is None else pss / _common.MB
            except SetupError:
                rows[key]["pss_mb"] = None
            except RunnerError as e:
                lost(r, e)
    finally:  # close every runner at once: TorchRL's and the Batcher's shutdowns overlap
        phases["measure"] = time.perf_counter() - t_phase
        t_phase = time.perf_counter()
        for r in runners:
            with contextlib.suppress(RunnerError):
                r.send({"cmd": "close"})
        for r in runners:
            r.finish()
        phases["close"] = time.perf_counter() - t_phase

    for key, reps_ in samples.items():
        if rows[key]["status"] != "ok" or not reps_:
            continue
        row = rows[key]
        row["steps_per_s"] = _common.summarize(s["steps_per_s"] for s in reps_)
        row["steps_per_s_reps"] = [s["steps_per_s"] for s in reps_]
        row["cpu_cores"] = _common.summarize(s["cores"] for s in reps_)
        row["steps_per_cpu_s"] = _common.summarize(s["steps"] / s["cpu_s"] for s in reps_)
        row["peak_rss_mb"] = max(s["peak_rss_bytes"] for s in reps_) / _common.MB
        row["peak_method"] = reps_[0]["peak_method"]
        row["n_procs"] = reps_[0]["n_procs"]
        row["steps_per_rep"] = _common.summarize(s["steps"] for s in reps_)
        row["wall_per_rep_s"] = _common.summarize(s["wall_s"] for s in reps_)
    rows["gym_async"]["notes"].append(
        "AsyncVectorEnv over 2 SyncBlockEnv (a gym.Env wrapping SyncVectorEnv(32), Dict obs in "
        "shared memory), copy=False")
    rows["gym_sync"]["notes"].append("copy=False; next-step auto-reset calls not counted")
    if versions["torchrl"] != "not installed":
        rows["torchrl"]["notes"].append(
            f"torchrl {versions['torchrl']}, tensordict {versions['tensordict']}; "
            "GymEnv(categorical_action_encoding=True), policy = TensorDictModule(same MLP + "
            "multinomial)")

    targets = []
    for num, den, minimum in TARGETS:
        a, b = rows[num], rows[den]
        t = {"name": f"{num} / {den}", "numerator": num, "denominator": den, "target": minimum,
             "ratio": None, "paired_min": None, "paired_max": None, "verdict": "n/a"}
        if "steps_per_s" in a and "steps_per_s" in b:
            t["ratio"] = a["steps_per_s"]["median"] / b["steps_per_s"]["median"]
            paired = [x / y for x, y in zip(a["steps_per_s_reps"], b["steps_per_s_reps"])]
            t["paired_min"], t["paired_max"] = min(paired), max(paired)
            t["verdict"] = "PASS" if t["ratio"] >= minimum else "MISS"
        else:
            t["verdict"] = f"n/a ({b['status'] if 'steps_per_s' in a else a['status']})"
        targets.append(t)
    check_costs = []
    for with_key, without_key in CHECK_COSTS:
        a, b = rows[with_key], rows[without_key]
        c = {"name": f"{with_key} / {without_key}", "with": with_key, "without": without_key,
             "ratio": None, "paired_min": None, "paired_max": None, "cost": None,
             "max_cost": MAX_CHECK_COST, "verdict": "n/a"}
        if "steps_per_s" in a and "steps_per_s" in b:
            c["ratio"] = a["steps_per_s"]["median"] / b["steps_per_s"]["median"]
            paired = [x / y for x, y in zip(a["steps_per_s_reps"], b["steps_per_s_reps"])]
            c["paired_min"], c["paired_max"] = min(paired), max(paired)
            c["cost"] = 1 - c["ratio"]
            c["verdict"] = "negligible" if c["cost"] <= MAX_CHECK_COST else "above the bar"
        check_costs.append(c)
    if "rl_batcher" in runner_of and "construct_s" in rows["rl_batcher"]:
        # The runner's first construction (constructor + reset) is the program's first Batcher.
        first = rows["rl_batcher"]["construct_s"]
        startup["first_s"] = first
        startup["first_verdict"] = "PASS" if first <= MAX_STARTUP_S else "MISS"
    if "construct_s" in startup and startup_reps:
        startup["later_target_s"] = MAX_LATER_STARTUP_S
        startup["verdict"] = (
            "PASS" if startup["construct_s"]["median"] <= MAX_LATER_STARTUP_S else "MISS")
    else:
        startup["verdict"] = "n/a"
    for k in ("bytes_per_transition",):
        startup[k] = rows["rl_batcher"].get(k)

    return {
        "benchmark": "throughput",
        "quick": quick,
        "config": {"env": ENV_ID, "n_envs": N_ENVS, "n_processes": N_PROCS,
                   "T": n_timesteps, "batch_transitions": N_ENVS * n_timesteps,
                   "reps": reps, "min_time_per_rep_s": min_time,
                   "warmup_batches": cfg["warmup_batches"], "warmup_s": cfg["warmup_s"],
                   "startup_reps": startup_reps,
                   "policy": "MLP 4-64-64-2 tanh, torch.multinomial(softmax), no_grad"},
        "environment": _common.environment(**versions),
        "rows": [rows[k] for k in SETUPS],
        "startup": startup,
        "targets": targets,
        "check_costs": check_costs,
        "phases_s": phases,
    }


# ------------------------------------------------------------------------------ output
def _k(x: float) -> str:
    return f"{x / 1000:.1f}k"


def print_table(result: dict) -> None:
    env, cfg = result["environment"], result["config"]
    print(
        f"rlstruct throughput benchmark: {cfg['env']}, {cfg['n_envs']} envs, T={cfg['T']} "
        f"({cfg['batch_transitions']} transitions per batch), {cfg['reps']} reps of >= "
        f"{cfg['min_time_per_rep_s']:g} s, interleaved; torch {env['torch']}, gymnasium "
        f"{env['gymnasium']}, torchrl {env['torchrl']}; 1 torch thread per process, "
        f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}; {env['cpu_count']} CPUs, "
        f"load avg {env['loadavg_at_start']}"
    )
    print("steps/s: median (min-max) over reps; CPU = cores the setup's process tree kept busy; "
          "RSS = sum of per-process peak RSS of the tree")
    head = (f"{'#':>2} {'setup':<48} {'steps/s median (min-max)':>28} {'CPU':>6} "
            f"{'steps/CPU-s':>11} {'RSS MB':>7} {'vs #2':>6}")
    print(head)
    print("-" * len(head))
    rows = {r["key"]: r for r in result["rows"]}
    base = rows["gym_sync"].get("steps_per_s", {}).get("median")
    for r in result["rows"]:
        if "steps_per_s" not in r:
            print(f"{r['row']:>2} {r['label']:<48} {r['status']:>28}")
            continue
        s = r["steps_per_s"]
        rel = f"{s['median'] / base:.2f}" if base else "n/a"
        print(
            f"{r['row']:>2} {r['label']:<48} "
            f"{_k(s['median']):>9} ({_k(s['min'])}-{_k(s['max'])})".ljust(81)
            + f"{r['cpu_cores']['median']:>6.2f} {_k(r['steps_per_cpu_s']['median']):>11} "
            f"{r['peak_rss_mb']:>7.0f} {rel:>6}"
        )
    st = result["startup"]
    if "construct_s" in st:
        c, w = st["construct_s"], st["workers_ready_s"]
        parts = [f"constructor {c['median']:.2f} s ({c['min']:.2f}-{c['max']:.2f}), of which "
                 f"workers ready {w['median']:.2f} s"]
        if "first_batch_s" in st:
            parts.append(f"reset + first batch {st['first_batch_s']['median']:.2f} s")
            parts.append(f"close {st['close_s']['median']:.2f} s")
        if st.get("note"):
            parts.append(st["note"])
        print(f"{7:>2} {'rlstruct Batcher start-up, 2 workers':<48} " + "; ".join(parts))
        if "first_s" in st:
            print(f"{'':>2} {'  first Batcher of the program (+ reset)':<48} "
                  f"{st['first_s']:.2f} s (target <= {MAX_STARTUP_S:g} s) {st['first_verdict']}")
        if st.get("later_target_s"):
            print(f"{'':>2} {'  later Batchers (constructor, median)':<48} "
                  f"{c['median']:.2f} s (target <= {MAX_LATER_STARTUP_S:g} s) {st['verdict']}")
        print(f"{'':>2} {'rlstruct buffer bytes per transition':<48} "
              f"{st['bytes_per_transition']:.0f} B")
    else:
        print(f"{7:>2} {'rlstruct Batcher start-up, 2 workers':<48} {st['status']}")
    print()
    print("targets (ratio of median steps/s; paired = range of the per-rep ratios):")
    for t in result["targets"]:
        num, den = rows[t["numerator"]], rows[t["denominator"]]
        name = f"#{num['row']} / #{den['row']}"
        if t["ratio"] is None:
            print(f"  {name:<8} >= {t['target']:<5g} {'':>24} {t['verdict']}")
        else:
            print(f"  {name:<8} >= {t['target']:<5g} {t['ratio']:>7.3f} (paired "
                  f"{t['paired_min']:.3f}-{t['paired_max']:.3f}) {t['verdict']}")
    if "first_s" in st:
        print(f"  first start-up <= {MAX_STARTUP_S:g} s: {st['first_s']:.2f} s "
              f"{st['first_verdict']}")
    if st.get("later_target_s"):
        print(f"  later start-up <= {MAX_LATER_STARTUP_S:g} s: "
              f"{st['construct_s']['median']:.2f} s {st['verdict']}")
    verdicts = [t["verdict"] for t in result["targets"]] + [st["verdict"]]
    verdicts += [st["first_verdict"]] if "first_s" in st else []
    print(f"{verdicts.count('PASS')} PASS, {verdicts.count('MISS')} MISS, "
          f"{len(verdicts) - verdicts.count('PASS') - verdicts.count('MISS')} n/a")
    print(f"observation check cost (check_obs=True vs False; ratio of median steps/s, paired = "
          f"range of the per-rep ratios; negligible: cost <= {MAX_CHECK_COST:.0%}):")
    for c in result.get("check_costs", []):
        name = f"#{rows[c['with']]['row']} / #{rows[c['without']]['row']}"
        if c["ratio"] is None:
            print(f"  {name:<9} {'':>24} {c['verdict']}")
        else:
            print(f"  {name:<9} {c['ratio']:>7.3f} (paired {c['paired_min']:.3f}-"
                  f"{c['paired_max']:.3f}) cost {c['cost']:+.1%} {c['verdict']}")


def run_pipeline_section(timeout_s: float = PIPELINE_TIMEOUT_S) -> dict:
    """Runs ``benchmarks/pipeline.py`` in a child process (its table goes to this stdout) and
    returns its JSON result, or ``{"status": "error: ..."}`` when it fails or overruns."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pipeline.json"
        script = Path(__file__).resolve().parent / "pipeline.py"
        try:
            code = subprocess.run([sys.executable, str(script), "--json", str(out)],
                                  timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return {"status": f"error: pipeline.py ran past {timeout_s:.0f} s"}
        if code != 0 or not out.is_file():
            return {"status": f"error: pipeline.py exited with {code}"}
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny reps (< 20 s)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--reps", type=int, help="timed repetitions (default 5, quick 3)")
    parser.add_argument("--min-time", type=float,
                        help="seconds per rep and setup (default 1.5, quick 0.05)")
    parser.add_argument("-T", dest="n_timesteps", type=int,
                        help="vector steps per batch (default 64, quick 16)")
    parser.add_argument("--no-pipeline", action="store_true",
                        help="skip the pipelined-collection section (benchmarks/pipeline.py)")
    parser.add_argument("--runner", help=argparse.SUPPRESS)
    parser.add_argument("--runner-config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runner:
        return runner_main(args.runner.split(","), json.loads(args.runner_config))
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be >= 1")
    _common.pin_threads(1)
    result = run(args.quick, args.reps, args.min_time, args.n_timesteps)
    print_table(result)
    if not args.quick and not args.no_pipeline:
        # Issue 11's rows, in the same run: shared-memory update and pipelined collection.
        # pipeline.py runs as its own program (it imports this module: no import circle).
        print("\n--- overlapping collection and learning (benchmarks/pipeline.py) ---",
              flush=True)
        result["pipeline"] = run_pipeline_section()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    errors = [r["key"] for r in result["rows"] if r["status"].startswith("error")]
    return 1 if errors or result["startup"]["status"].startswith("error") else 0


if __name__ == "__main__":
    sys.exit(main())

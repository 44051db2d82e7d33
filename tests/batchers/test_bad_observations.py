"""Bad observations are named where they come from (issue 27, section 3).

- A Box env whose observation holds NaN or an infinity at a given step raises
  :class:`ObservationError` in that step (or in the reset that produced it), before any agent
  acts on it: through a ``SerialBatcher`` as itself, through a 2-worker ``Batcher`` as a
  ``WorkerError`` that carries its message; both name worker, GLOBAL env index, step and key.
  Before, the policy's output became NaN and the action check fired instead (``ActionError:
  action [nan] is outside the action space``), or the infinity was learned from.
- ``rlstruct.algos.ppo`` on such an env fails with that error, not with ``ActionError``.
- Env messages name GLOBAL env indices even when ``create_env`` gives its VecEnv no offset (as
  the CLI's ``GymEnvInf(env, n_envs, seed)`` does): the batchers tell each env its offset.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.batchers.seeding import SEED_BLOCK
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.gym import GymEnvInf
from rlstruct.errors import ObservationError, WorkerError

pytestmark = pytest.mark.timeout(120)

RUN_SEED = 4
N_ENVS = 3  # per process; with 2 workers, global env 4 is env 1 of worker 1
BAD_VALUES = {"nan": float("nan"), "+inf": float("inf")}


class BadObsEnv(gym.Env):
    """A float32 Box(3) env with Box actions whose observation holds ``value`` in element 1 at
    its ``bad_at``-th step (``bad_at=0``: in its reset observation) when it is the env of GLOBAL
    index ``bad_env``, which it learns from its first reset seed (``run_seed * 2**20 + g``, the
    batchers' rule); its other observations are zeros."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention
    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, bad_env: int = -1, bad_at: int = 2, value: float = float("nan")) -> None:
        self.bad_env, self.bad_at, self.value = bad_env, bad_at, value
        self.index = -1
        self.t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(3, np.float32)
        if self.index == self.bad_env and self.t == self.bad_at:
            obs[1] = self.value
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.index = seed % SEED_BLOCK
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), 0.0, False, self.t >= 50, {}


def bad_obs_env(n_envs: int, seed: int, **kwargs: Any) -> GymEnvInf:
    """A ``create_env`` like the CLI's: ``GymEnvInf`` given no ``env_id_offset``."""
    return GymEnvInf([lambda: BadObsEnv(**kwargs)] * n_envs, seed=seed)


class NaNPolicyAgent(Agent):
    """Acts like a policy network: its action is a function of the observation (so a NaN
    observation would give a NaN action, which the env's action check refuses)."""

    def __call__(self, state, observation, agent_info):
        frame = observation["frame"]
        action = torch.tanh(frame.sum(dim=1, keepdim=True))
        return DictTensor({"action": action}), state


def _batcher(workers: int, **env_args: Any) -> SerialBatcher | Batcher:
    args = (5, NaNPolicyAgent, {}, bad_obs_env, {"n_envs": N_ENVS, **env_args})
    if workers == 0:
        return SerialBatcher(*args, seeds=RUN_SEED)
    return Batcher(*args, n_processes=workers, seeds=RUN_SEED, timeout=60, start_timeout=60)


# ------------------------------------------------------------------ the env itself
@pytest.mark.parametrize("value", list(BAD_VALUES), ids=list(BAD_VALUES))
def test_the_vec_env_raises_at_the_step_naming_env_key_and_env_step(value: str) -> None:
    env = bad_obs_env(N_ENVS, seed=RUN_SEED * SEED_BLOCK, bad_env=1, value=BAD_VALUES[value])
    env.set_env_id_offset(7)
    env.reset()
    action = DictTensor({"action": torch.zeros(N_ENVS, 1)})
    env.step(action)
    with pytest.raises(ObservationError) as info:
        env.step(action)
    err = info.value
    shown = "nan" if value == "nan" else "inf"
    assert str(err).startswith(f"env 8: observation key 'frame' holds {shown} at env_step 2")
    assert (err.env_index, err.env, err.key, err.env_step) == (1, 8, "frame", 2)
    assert (err.worker, err.step) == (None, None)  # outside a batcher
    assert isinstance(err, ValueError)
    with pytest.raises(Exception, match=r"reset\(\)"):  # the step failed: reset to go on
        env.step(action)
    unchecked = GymEnvInf(
        [lambda: BadObsEnv(bad_env=0, value=BAD_VALUES[value])],
        seed=RUN_SEED * SEED_BLOCK, check_obs=False,
    )
    unchecked.reset()
    unchecked.step(DictTensor({"action": torch.zeros(1, 1)}))
    (obs_t1, _), _ = unchecked.step(DictTensor({"action": torch.zeros(1, 1)}))
    assert not torch.isfinite(obs_t1["frame"]).all()  # check_obs=False lets it through


def test_a_bad_reset_observation_raises_in_reset() -> None:
    env = bad_obs_env(N_ENVS, seed=RUN_SEED * SEED_BLOCK + 3, bad_env=5, bad_at=0)
    env.set_env_id_offset(3)
    with pytest.raises(ObservationError, match=r"^env 5: observation key 'frame' holds nan in "
                       r"its reset observation") as info:
        env.reset()
    assert (info.value.env_index, info.value.env, info.value.env_step) == (2, 5, 0)


def test_a_dict_observation_names_its_leaf() -> None:
    class DictObs(gym.ObservationWrapper):
        def __init__(self, env: gym.Env) -> None:
            super().__init__(env)
            self.observation_space = spaces.Dict(
                {"count": spaces.Discrete(3), "pos": env.observation_space}
            )

        def observation(self, obs: np.ndarray) -> dict:
            return {"count": 0, "pos": obs}

    env = GymEnvInf([lambda: DictObs(BadObsEnv(bad_env=0, bad_at=1, value=-np.inf))], seed=0)
    env.reset()
    with pytest.raises(ObservationError, match=r"^env 0: observation key 'pos' holds -inf at "
                       r"env_step 1") as info:
        env.step(DictTensor({"action": torch.zeros(1, 1)}))
    assert info.value.key == "pos"


# ------------------------------------------------------------------ through the batchers
@pytest.mark.parametrize("value", list(BAD_VALUES), ids=list(BAD_VALUES))
def test_serial_batcher_raises_the_observation_error(value: str) -> None:
    with _batcher(0, bad_env=2, value=BAD_VALUES[value]) as b:
        b.reset()
        with pytest.raises(ObservationError) as info:
            b.execute()
    err = info.value
    shown = "nan" if value == "nan" else "inf"
    assert str(err).startswith(f"env 2: observation key 'frame' holds {shown} at env_step 2")
    # worker 0 (the SerialBatcher's own loop), step 1 of the segment (its second action)
    assert (err.worker, err.env, err.step, err.key, err.env_step) == (0, 2, 1, "frame", 2)


@pytest.mark.parametrize("value", list(BAD_VALUES), ids=list(BAD_VALUES))
def test_batcher_worker_error_carries_the_observation_error(value: str) -> None:
    with _batcher(2, bad_env=4, value=BAD_VALUES[value]) as b:
        b.reset()
        b.execute()
        with pytest.raises(WorkerError) as info:
            b.get()
    err = info.value
    shown = "nan" if value == "nan" else "inf"
    assert (err.worker, err.env, err.step, err.exc_type) == (1, 4, 1, "ObservationError")
    assert str(err).startswith(
        f"worker 1, env 4, step 1 during env step: ObservationError: env 4: observation key "
        f"'frame' holds {shown} at env_step 2"
    )
    assert "ActionError" not in str(err)


def test_a_bad_reset_observation_in_a_worker_is_named() -> None:
    with _batcher(2, bad_env=5, bad_at=0) as b, pytest.raises(WorkerError) as info:
        b.reset()
    err = info.value
    assert (err.worker, err.env, err.exc_type) == (1, 5, "ObservationError")
    assert str(err).startswith(
        "worker 1, env 5 during env reset: ObservationError: env 5: observation key 'frame' "
        "holds nan in its reset observation"
    )


class WrongDtypeEnv(BadObsEnv):
    """Returns a float64 observation (its space says float32) at step ``bad_at``."""

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, *rest = super().step(action)
        if self.index == self.bad_env and self.t == self.bad_at:
            obs = obs.astype(np.float64)
        return (obs, *rest)


def wrong_dtype_env(n_envs: int, seed: int, bad_env: int) -> GymEnvInf:
    """A ``create_env`` like the CLI's (no ``env_id_offset``)."""
    return GymEnvInf([lambda: WrongDtypeEnv(bad_env=bad_env)] * n_envs, seed=seed)


def test_a_space_error_of_a_workers_second_env_names_its_global_index() -> None:
    # Worker 1's second env is global env 4 (local env 1): every part of the message says 4.
    args = (5, NaNPolicyAgent, {}, wrong_dtype_env, {"n_envs": N_ENVS, "bad_env": 4})
    with Batcher(*args, n_processes=2, seeds=RUN_SEED, timeout=60, start_timeout=60) as b:
        b.reset()
        b.execute()
        with pytest.raises(WorkerError) as info:
            b.get()
    err = info.value
    assert (err.worker, err.env, err.exc_type) == (1, 4, "SpaceError")
    assert "during env step: SpaceError: env 4: observation key 'frame'" in str(err)
    assert "env 1:" not in str(err)


# ------------------------------------------------------------------ a training run
NAN_ENV_MODULE = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np

    class NaNAt(gym.Env):
        """Box observations and actions; element 1 of the observation is {value} at step 3 of
        every episode of global env {bad_env} (seed % 2**20, the batchers' rule)."""
        observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            if seed is not None:
                self.index = seed % 2**20
            self.t = 0
            return np.zeros(3, np.float32), {{}}

        def step(self, action):
            self.t += 1
            obs = np.zeros(3, np.float32)
            if self.t == 3 and self.index == {bad_env}:
                obs[1] = float("{value}")
            return obs, 0.0, False, self.t >= 20, {{}}

    gym.register("TmpNaNAt-v0", entry_point=NaNAt)
''')


@pytest.mark.parametrize(
    ("value", "n_processes"), [("nan", 1), ("+inf", 2)], ids=["nan-serial", "inf-2-workers"]
)
def test_ppo_fails_with_the_observation_error_not_an_action_error(
    tmp_path: Path, value: str, n_processes: int
) -> None:
    bad_env = 2 * n_processes - 1  # the last env: with 2 workers, env 1 of worker 1
    (tmp_path / "tmp_nan_env.py").write_text(
        NAN_ENV_MODULE.format(value=value, bad_env=bad_env)
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    args = [
        sys.executable, "-m", "rlstruct.algos.ppo", "--env-id", "TmpNaNAt-v0",
        "--env-module", "tmp_nan_env", "--n-processes", str(n_processes), "--n-envs", "2",
        "--n-timesteps", "8", "--max-frames", "200", "--eval-every", "0",
        "--runs-dir", str(tmp_path / "runs"),
    ]
    # Its own process, with a deadline: a hang fails the test instead of blocking the suite.
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=100)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    shown = "nan" if value == "nan" else "inf"
    message = (
        f"ObservationError: env {bad_env}: observation key 'frame' holds {shown} at env_step 3"
    )
    # --n-processes 1 collects in the run's own process (a SerialBatcher): the error itself;
    # with worker processes, the WorkerError that carries it, naming worker, env and step.
    where = "" if n_processes == 1 else "WorkerError: worker 1, env 3, step 2 during env step: "
    assert f"{where}{message}" in out, out[-3000:]
    assert "ActionError" not in out and "NonFiniteError" not in out, out[-3000:]

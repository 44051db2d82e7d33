"""NaN and infinite observations in the VecEnvs other than GymEnv (whose checks, and the
batchers', are in tests/batchers/test_bad_observations.py): the torch-native envs at a step and
in a reset observation (both auto-reset paths), ``check_obs=False``, and the global env offset
that ``make_env_on`` hands to an env, through a ``DeviceEnv`` too (issue 27, section 3)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import torch
from torch import Tensor

from rlstruct import DictTensor
from rlstruct.batchers.serial import make_env_on
from rlstruct.envs import DeviceEnv, GymEnv
from rlstruct.envs.torch import CartPole
from rlstruct.errors import ActionError, BatcherStateError, ConfigError, ObservationError

CPU = torch.device("cpu")


def push(n: int) -> DictTensor:
    return DictTensor({"action": torch.ones(n, dtype=torch.long)})


@pytest.mark.parametrize("auto_reset", [False, True], ids=["episodic", "auto-reset"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_torch_env_refuses_a_bad_observation_at_the_step(auto_reset: bool, value: float) -> None:
    env = CartPole(n_envs=3, seed=0, auto_reset=auto_reset, env_id_offset=10)
    env.reset()
    env.step(push(3))
    env.state[1, 1] = value  # a state gone wrong (x_dot): the next observation follows it
    with pytest.raises(ObservationError) as info:
        env.step(push(3))
    err = info.value
    assert str(err).startswith(f"env 11: observation key 'frame' holds {value} at env_step 2")
    assert (err.env_index, err.env, err.key, err.env_step) == (1, 11, "frame", 2)
    with pytest.raises(BatcherStateError, match=r"reset\(\)"):
        env.step(push(3))
    env.reset()  # usable again
    env.step(push(3))


def test_torch_env_with_check_obs_off_lets_it_through() -> None:
    env = CartPole(n_envs=2, seed=0, auto_reset=True, check_obs=False)
    env.reset()
    env.state[0, 1] = float("nan")
    (obs_t1, _), _ = env.step(push(2))
    assert torch.isnan(obs_t1["frame"][0]).any()


class InfAfterFirstReset(CartPole):
    """CartPole whose initial states hold +inf in x from its second draw on."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.draws = 0

    def initial_state(self, u: Tensor, options: Mapping[str, Tensor]) -> Tensor:
        state = super().initial_state(u, options)
        self.draws += 1
        if self.draws > 1:
            state[:, 0] = float("inf")
        return state


def test_torch_env_refuses_a_bad_reset_observation() -> None:
    env = InfAfterFirstReset(n_envs=2, seed=0, env_id_offset=4)
    env.reset()
    with pytest.raises(ObservationError, match=r"^env 4: observation key 'frame' holds inf in its "
                       r"reset observation") as info:
        env.reset()
    assert (info.value.env, info.value.env_step) == (4, 0)
    with pytest.raises(BatcherStateError):
        env.step(push(2))


@pytest.mark.parametrize("masked", [False, True], ids=["ended-rows", "masked-all-rows"])
def test_torch_env_refuses_a_bad_auto_reset_observation(masked: bool) -> None:
    env = InfAfterFirstReset(n_envs=2, seed=0, auto_reset=True, max_episode_steps=2,
                             env_id_offset=6)
    env._sync_free = masked  # the GPU's masked auto-reset path, run on the CPU
    env.reset()
    env.step(push(2))  # env_step 1
    with pytest.raises(ObservationError, match=r"^env 6: observation key 'frame' holds inf in its "
                       r"reset observation"):
        env.step(push(2))  # both episodes end (time limit): their new initial states are inf


def test_make_env_on_gives_the_env_its_global_offset() -> None:
    env = make_env_on(CartPole, {"n_envs": 2, "auto_reset": True}, seed=0, device=CPU,
                      env_id_offset=6)
    env.reset()
    env.state[1, 1] = float("nan")
    with pytest.raises(ObservationError, match=r"^env 7: "):
        env.step(push(2))
    with pytest.raises(ConfigError, match="env_id_offset"):
        env.set_env_id_offset(-1)


def test_device_env_passes_the_offset_on() -> None:
    from rlstruct.envs.debug import CounterEnv

    env = DeviceEnv(GymEnv([CounterEnv, CounterEnv]), "cpu", "cpu")
    env.set_env_id_offset(8)
    env.reset()
    with pytest.raises(ActionError, match=r"^env 9: action"):
        env.step(DictTensor({"action": torch.tensor([0, 7])}))


def test_integer_observations_are_not_checked() -> None:
    # Nothing to check in an int frame: the check is per float key only.
    from rlstruct.envs.debug import make_counter_env

    env = make_counter_env(2)
    obs, _ = env.reset()
    assert obs["frame"].dtype == torch.int64 and env._obs_checked == []
    assert np.isfinite(obs["reward"].numpy()).all()

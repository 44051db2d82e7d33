"""rlstruct/envs/masks.py through GymEnv and GymEnvInf: an env's ``info["action_mask"]`` becomes
the bool observation key ``action_mask`` at reset and at every step (detected at the first reset,
or forced by ``action_mask=``), a Dict observation's ``action_mask`` leaf is kept as it is, and a
mask an agent would act on that allows no action raises ActionMaskError naming the env."""

from __future__ import annotations

from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstruct import DictTensor
from rlstruct import keys as K
from rlstruct.envs import GymEnv, GymEnvInf
from rlstruct.envs.debug import MASKED_CHOICE_HIDDEN_ID, MASKED_CHOICE_ID, MaskedChoiceEnv
from rlstruct.errors import ActionMaskError, ConfigError

A = 5


def _legal(obs: DictTensor) -> torch.Tensor:
    """The first legal action of each row."""
    return obs[K.ACTION_MASK].float().argmax(-1)


@pytest.mark.parametrize("cls", [GymEnv, GymEnvInf])
def test_info_masks_are_observation_keys_at_reset_and_step(cls):
    env = cls([partial(MaskedChoiceEnv, n_actions=A, episode_length=3)] * 3, seed=1)
    obs, _ = env.reset()
    spec = (torch.Size([A]), torch.bool)
    assert env.observation_specs()[K.ACTION_MASK] == spec
    assert obs[K.ACTION_MASK].dtype == torch.bool and obs[K.ACTION_MASK].shape == (3, A)
    for _ in range(3):
        masks = np.stack([e.unwrapped._mask.astype(bool) for e in env.envs])
        np.testing.assert_array_equal(obs[K.ACTION_MASK].numpy(), masks[:len(obs[K.ACTION_MASK])])
        (t1, _), (obs, _) = env.step(DictTensor({K.ACTION_KEY: _legal(obs)}))
        assert set(t1.keys()) == set(obs.keys())
        assert (t1[K.ACTION_MASK].dtype, t1[K.ACTION_MASK].shape[1:]) == (torch.bool, (A,))
        assert float(t1[K.REWARD].min()) == 1.0  # legal actions only
    assert [e.unwrapped.n_illegal for e in env.envs] == [0, 0, 0]


def test_an_auto_reset_row_holds_the_reset_observations_mask():
    env = GymEnvInf([partial(MaskedChoiceEnv, n_actions=A, episode_length=1)] * 2)
    obs, _ = env.reset()
    (t1, _), (nxt, _) = env.step(DictTensor({K.ACTION_KEY: _legal(obs)}))
    assert bool(t1[K.DONE].all()) and bool(nxt[K.INITIAL_STATE].all())
    reset_masks = np.stack([e.unwrapped._mask.astype(bool) for e in env.envs])
    np.testing.assert_array_equal(nxt[K.ACTION_MASK].numpy(), reset_masks)
    assert not np.array_equal(t1[K.ACTION_MASK].numpy(), reset_masks)  # the final obs' own


def test_no_mask_key_without_a_mask_or_when_turned_off():
    env = GymEnv(MASKED_CHOICE_HIDDEN_ID, n_envs=2)
    assert K.ACTION_MASK not in env.reset()[0]
    env = GymEnv(MASKED_CHOICE_ID, n_envs=2, action_mask=False)
    assert K.ACTION_MASK not in env.reset()[0]
    env = GymEnv(MASKED_CHOICE_ID, n_envs=2, action_mask=True)
    assert K.ACTION_MASK in env.observation_specs()  # known before the first reset
    assert K.ACTION_MASK in env.reset()[0]
    with pytest.raises(ConfigError, match="Discrete"):
        GymEnv("Pendulum-v1", action_mask=True)


def test_a_dict_observation_keeps_its_mask_leaf():
    env = GymEnvInf([partial(MaskedChoiceEnv, n_actions=A, dict_obs=True)] * 2)
    obs, _ = env.reset()
    assert {"observation", K.ACTION_MASK} <= set(obs.keys())
    (t1, _), _ = env.step(DictTensor({K.ACTION_KEY: _legal(obs)}))
    assert float(t1[K.REWARD].min()) == 1.0


class _EmptyMask(gym.Env):
    """Discrete(3); its mask allows nothing at reset (``at_reset``) or after ``empty_at`` steps;
    ``drop_at``: the step whose info lacks the mask."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, at_reset: bool = False, empty_at: int = 99, end_at: int = 99,
                 drop_at: int = 99) -> None:
        self.at_reset, self.empty_at, self.end_at, self.drop_at = at_reset, empty_at, end_at, \
            drop_at
        self.t = 0

    def _info(self) -> dict[str, Any]:
        if self.t == self.drop_at:
            return {}
        empty = self.t >= self.empty_at or (self.t == 0 and self.at_reset)
        return {"action_mask": np.zeros(3, np.int8) if empty else np.ones(3, np.int8)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), self._info()

    def step(self, action: Any):
        self.t += 1
        return np.zeros(1, np.float32), 0.0, self.t >= self.end_at, False, self._info()


def _envs(n: int = 2, **kw: Any) -> list:
    return [lambda: _EmptyMask()] * (n - 1) + [partial(_EmptyMask, **kw)]


def test_an_empty_mask_at_reset_names_the_env():
    env = GymEnv(_envs(at_reset=True, empty_at=0), env_id_offset=10)
    with pytest.raises(ActionMaskError, match="env 11: the action mask allows no action") as e:
        env.reset()
    assert e.value.env_index == 1


def test_an_empty_mask_at_a_step_names_the_env_but_a_final_one_is_allowed():
    env = GymEnvInf(_envs(empty_at=2))
    _obs, _ = env.reset()
    env.step(DictTensor({K.ACTION_KEY: torch.zeros(2, dtype=torch.long)}))
    with pytest.raises(ActionMaskError, match=r"env 1: .* at env_step 2"):
        env.step(DictTensor({K.ACTION_KEY: torch.zeros(2, dtype=torch.long)}))
    env = GymEnv(_envs(empty_at=1, end_at=1))  # the final observation allows nothing: fine
    env.reset()
    (t1, _), _ = env.step(DictTensor({K.ACTION_KEY: torch.zeros(2, dtype=torch.long)}))
    assert not bool(t1[K.ACTION_MASK][1].any())


def test_a_mask_that_disappears_names_the_env():
    env = GymEnvInf(_envs(drop_at=1))
    env.reset()
    with pytest.raises(ActionMaskError, match="env 1: info lacks 'action_mask'"):
        env.step(DictTensor({K.ACTION_KEY: torch.zeros(2, dtype=torch.long)}))

"""rlstruct/blocks/nets.py: HeadActorCritic's two initialisations (``init="orthogonal"``, the
default, and ``init="torch"``, rl-zoo's ``ortho_init=False`` that PPO's MuJoCo preset uses)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from rlstruct.algos import ppo
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.nets import head_actor_critic

BOX = space_spec(spaces.Box(-1.0, 1.0, (3,), np.float32))


def linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def test_torch_init_redraws_every_linear_layer_with_nn_linear_s_default():
    torch.manual_seed(0)
    model = head_actor_critic(11, BOX, 256, -2.0, True, "relu", True, "torch")
    assert len(linears(model)) == 6  # actor 2 + mean, critic 3
    for layer in linears(model):
        bound = 1 / math.sqrt(layer.in_features)  # kaiming_uniform(a=sqrt(5)): U(-b, b)
        assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.9 * bound
        assert layer.bias.abs().max() <= bound and layer.bias.abs().max() > 0  # not zeros
    assert torch.equal(model.head.log_std, torch.full((3,), -2.0))  # the free log-std is kept


def test_orthogonal_init_stays_the_default_with_its_small_policy_output():
    torch.manual_seed(0)
    ortho = head_actor_critic(11, BOX, 256, -2.0, True, "relu", True)
    torch.manual_seed(0)
    plain = head_actor_critic(11, BOX, 256, -2.0, True, "relu", True, "torch")
    for layer in linears(ortho):
        assert torch.count_nonzero(layer.bias) == 0
    obs = torch.randn(64, 11)
    mean_ortho, mean_plain = ortho(obs)[0][:, :3], plain(obs)[0][:, :3]
    assert mean_ortho.abs().max() < 0.1 < mean_plain.abs().max()  # gain 0.01 against torch's


def test_an_unknown_init_is_refused():
    with pytest.raises(ValueError, match=r"init must be one of \('orthogonal', 'torch'\)"):
        head_actor_critic(4, BOX, 8, init="xavier")


def test_the_mujoco_preset_follows_rl_zoo_s_nets():
    cheetah = ppo.Config.from_preset("mujoco", env_id="HalfCheetah-v5")
    assert (cheetah.init, cheetah.hidden, cheetah.activation, cheetah.log_std_init) == (
        "torch", 256, "relu", -2.0)
    for env in ("Walker2d-v5", "Hopper-v5"):  # SB3's default MlpPolicy; CleanRL's net
        cfg = ppo.Config.from_preset("mujoco", env_id=env)
        assert (cfg.init, cfg.hidden, cfg.activation, cfg.log_std_init) == (
            "orthogonal", 64, "tanh", 0.0)
    assert ppo.Config().init == "orthogonal"

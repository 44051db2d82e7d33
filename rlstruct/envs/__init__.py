"""Vectorised environments: ``N`` gymnasium envs behind one DictTensor interface.

``VecEnv`` is the contract (see :mod:`rlstruct.envs.base`); ``GymEnv`` (episodic) and
``GymEnvInf`` (auto-reset) step gymnasium envs on the CPU; ``DeviceEnv`` moves their tensors to
another device; ``EnvPoolEnv`` steps an envpool batch (the ``envpool`` extra);
``VectorEnvAdapter`` steps a user's ``gymnasium.vector.VectorEnv`` (auto-reset);
``make_atari_env`` builds preprocessed Atari envs (the ``atari`` extra); :mod:`rlstruct.envs.torch`
holds envs written as batched tensor maths on any device. The debug envs of
:mod:`rlstruct.envs.debug` and the partially observed CartPole of :mod:`rlstruct.envs.pomdp` are
registered with gymnasium as ``rlstruct/Counter-v0``, ``rlstruct/Repeat-v0``,
``rlstruct/MaskedChoice-v0`` (an action-mask task, and ``rlstruct/MaskedChoiceHidden-v0`` without
its mask) and ``rlstruct/CartPoleNoVel-v1`` on import (idempotent; the only import-time effect of
this package). Action masks: :mod:`rlstruct.envs.masks`.
"""

from rlstruct.envs.atari import make_atari_env
from rlstruct.envs.base import VecEnv
from rlstruct.envs.debug import (
    COUNTER_ID,
    REPEAT_ID,
    CounterEnv,
    RepeatEnv,
    make_counter_env,
    make_repeat_env,
    register_debug_envs,
)
from rlstruct.envs.device import DeviceEnv
from rlstruct.envs.envpool import EnvPoolEnv
from rlstruct.envs.gym import EnvFactory, GymEnv, GymEnvInf
from rlstruct.envs.pomdp import CARTPOLE_NOVEL_ID, register_pomdp_envs
from rlstruct.envs.vector import VectorEnvAdapter

register_debug_envs()
register_pomdp_envs()

__all__ = [
    "VecEnv",
    "GymEnv",
    "GymEnvInf",
    "DeviceEnv",
    "EnvPoolEnv",
    "VectorEnvAdapter",
    "make_atari_env",
    "EnvFactory",
    "CounterEnv",
    "RepeatEnv",
    "COUNTER_ID",
    "REPEAT_ID",
    "make_counter_env",
    "make_repeat_env",
    "register_debug_envs",
    "CARTPOLE_NOVEL_ID",
    "register_pomdp_envs",
]

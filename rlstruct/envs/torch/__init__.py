"""Torch-native vectorised envs: ``N`` envs as one state tensor ``(N, d)`` on any device.

:class:`TorchVecEnv` is the base (batched dynamics, masked auto-reset inside ``step``, episode
step limits, per-env counter-based random streams, vectorised action checks); ``CartPole``,
``Acrobot``, ``MountainCar`` and ``Pendulum`` are gymnasium's ``CartPole-v1``, ``Acrobot-v1``,
``MountainCar-v0`` and ``Pendulum-v1`` written as tensor maths: same spaces, rewards,
termination rules, time limits, initial-state ranges and observation keys as a
:class:`~rlstruct.envs.GymEnv` over the gymnasium env. Each class is a valid ``create_env``
for the batchers::

    SerialBatcher(T, create_agent, {}, CartPole, {"n_envs": 4096, "auto_reset": True})

See docs/guide-torch-envs.md.
"""

from rlstruct.envs.torch.acrobot import Acrobot
from rlstruct.envs.torch.base import TorchVecEnv
from rlstruct.envs.torch.cartpole import CartPole
from rlstruct.envs.torch.mountain_car import MountainCar
from rlstruct.envs.torch.pendulum import Pendulum

__all__ = ["TorchVecEnv", "CartPole", "Acrobot", "MountainCar", "Pendulum"]


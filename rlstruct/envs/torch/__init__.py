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
from rlstruct.errors import ConfigError

__all__ = [
    "TorchVecEnv", "CartPole", "Acrobot", "MountainCar", "Pendulum", "BY_GYM_ID", "make_torch_env"
]

#: The gymnasium id each torch-native env reproduces.
BY_GYM_ID: dict[str, type[TorchVecEnv]] = {
    "CartPole-v1": CartPole,
    "Acrobot-v1": Acrobot,
    "MountainCar-v0": MountainCar,
    "Pendulum-v1": Pendulum,
}


def make_torch_env(
    env: str, n_envs: int, seed: int, device: str = "cpu", auto_reset: bool = True
) -> TorchVecEnv:
    """The torch-native version of gymnasium's ``env``: a ``create_env`` with GymEnvInf's
    arguments (``env``, ``n_envs``, ``seed``) plus the ``device`` the env lives on.

    Raises:
        ConfigError: no torch-native version of ``env``.

    Examples:
        >>> make_torch_env("CartPole-v1", n_envs=3, seed=0).reset()[0]["frame"].shape
        torch.Size([3, 4])
    """
    if env not in BY_GYM_ID:
        raise ConfigError(
            f"no torch-native version of {env!r}; there are {sorted(BY_GYM_ID)} (use the "
            "gymnasium env backend for the others)"
        )
    return BY_GYM_ID[env](n_envs=n_envs, seed=seed, device=device, auto_reset=auto_reset)


"""``DeviceEnv``: a VecEnv seen from another device.

The wrapped env lives on ``from_device`` (normally the CPU, where gymnasium runs); its caller (the
agent, the batcher's buffers) lives on ``to_device``. Observations, ``env_info`` and running
indices cross to ``to_device``, actions cross back to ``from_device``. Host-to-GPU copies are
``non_blocking`` (asynchronous when the source is pinned, a plain copy otherwise; both are safe
because the host source is not reused). Copies towards the host are blocking: the env reads the
action as soon as ``step`` has it.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import Tensor

from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import StepResult, VecEnv

__all__ = ["DeviceEnv"]

DeviceLike = str | torch.device | int


class DeviceEnv(VecEnv):
    """Wraps ``env`` so that its observations live on ``to_device`` and it takes actions there.

    Args:
        env: the VecEnv, whose tensors live on ``from_device``.
        from_device: the device of ``env`` (``"cpu"`` for gymnasium envs).
        to_device: the device of the caller.

    Examples:
        >>> from rlstruct.envs.debug import make_counter_env
        >>> env = DeviceEnv(make_counter_env(2), "cpu", "meta")
        >>> obs, running = env.reset()
        >>> obs.device(), running.device
        (device(type='meta'), device(type='meta'))
    """

    def __init__(
        self, env: VecEnv, from_device: DeviceLike = "cpu", to_device: DeviceLike = "cuda"
    ) -> None:
        if not isinstance(env, VecEnv):
            raise TypeError(f"DeviceEnv wraps a VecEnv, got {type(env).__name__}")
        self.env = env
        self.from_device = torch.device(from_device)
        self.to_device = torch.device(to_device)
        self._up_async = self.from_device.type == "cpu" and self.to_device.type != "cpu"

    @property
    def device(self) -> torch.device:
        """``to_device``: where the caller sees the env."""
        return self.to_device

    @property
    def action_space(self) -> gym.Space:  # type: ignore[override]
        """The wrapped env's single-env action space."""
        return self.env.action_space

    @property
    def observation_space(self) -> gym.Space:  # type: ignore[override]
        """The wrapped env's single-env observation space."""
        return self.env.observation_space

    def n_envs(self) -> int:
        """``N`` of the wrapped env."""
        return self.env.n_envs()

    def observation_specs(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """The wrapped env's ``observation_specs()`` (if it has them)."""
        return self.env.observation_specs()  # type: ignore[attr-defined]

    def _up(self, obs: DictTensor, running: Tensor) -> tuple[DictTensor, Tensor]:
        nb = self._up_async
        return obs.to(self.to_device, non_blocking=nb), running.to(self.to_device, non_blocking=nb)

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, Tensor]:
        """Resets the wrapped env; ``env_info`` may live on any device.

        Returns:
            ``(observation (N, ...), running (N,))``, both on ``to_device``.
        """
        if env_info is not None:
            env_info = env_info.to(self.from_device)
        return self._up(*self.env.reset(env_info))

    def step(self, action: DictTensor) -> StepResult:
        """Moves ``action`` to ``from_device``, steps, and moves the answers to ``to_device``."""
        (obs_t1, was), (obs_next, running) = self.env.step(action.to(self.from_device))
        up_t1, up_was = self._up(obs_t1, was)
        if obs_next.empty():
            return (up_t1, up_was), self._up(obs_next, running)
        # Tensors that obs_next shares with obs_t1 (rows that were not reset) cross only once.
        nb, dev = self._up_async, self.to_device
        t1 = dict(obs_t1.items())
        nxt = {
            k: up_t1[k] if t1.get(k) is v else v.to(dev, non_blocking=nb)
            for k, v in obs_next.items()
        }
        up_next = DictTensor.trusted(nxt, obs_next.batch_size, up_t1.device())
        return (up_t1, up_was), (up_next, running.to(dev, non_blocking=nb))

    def set_env_id_offset(self, offset: int) -> None:
        """Passes the global index of env 0 on to the wrapped env (its error messages).

        Args:
            offset: the global index of env 0.
        """
        self.env.set_env_id_offset(offset)

    def close(self) -> None:
        """Closes the wrapped env."""
        self.env.close()

    def __repr__(self) -> str:
        return (
            f"DeviceEnv({self.env!r}, from_device={self.from_device}, to_device={self.to_device})"
        )

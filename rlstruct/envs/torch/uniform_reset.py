"""Initial states uniform in ``[low, high]`` per component: the reset of CartPole and Acrobot.

Gymnasium's ``CartPole-v1`` and ``Acrobot-v1`` draw every state component from
``np_random.uniform(low, high)`` and take ``low`` and ``high`` as reset options;
``MountainCar-v0`` draws its position that way. :class:`UniformResetEnv` is that reset for a
:class:`~rlstruct.envs.torch.TorchVecEnv`, and :func:`check_low_high` its option check.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from rlstruct.envs.torch.base import TorchVecEnv
from rlstruct.errors import ConfigError

__all__ = ["UniformResetEnv", "check_low_high"]


def check_low_high(options: Mapping[str, Tensor]) -> None:
    """Refuses reset bounds with ``low > high`` (gymnasium raises ``ValueError`` for them).

    Raises:
        ConfigError: naming the first env whose ``low`` exceeds its ``high``.
    """
    bad = options["low"] > options["high"]
    if bool(bad.any()):
        k = int(bad.nonzero()[0, 0])
        raise ConfigError(
            f"env {k}: reset option low={float(options['low'][k])} is above "
            f"high={float(options['high'][k])}"
        )


class UniformResetEnv(TorchVecEnv):
    """A TorchVecEnv whose initial state is uniform in ``[low, high]`` per component.

    A subclass declares ``reset_options = {"low": ..., "high": ...}`` (its defaults) and
    ``n_draws = state_size``: one uniform per component.
    """

    def initial_state(self, u: Tensor, options: Mapping[str, Tensor]) -> Tensor:
        """Uniform in ``[low, high]`` per component: ``(n, d)`` from ``u`` ``(n, d)``."""
        low, high = options["low"][:, None], options["high"][:, None]
        return low + (high - low) * u

    def check_options(self, options: Mapping[str, Tensor]) -> None:
        """``low <= high`` for every env."""
        check_low_high(options)

"""Small network builders the algorithms share: orthogonally initialised layers and MLPs.

Orthogonal weights with gain ``sqrt(2)`` for tanh hidden layers and a small output gain (0.01
for policy logits: the policy starts near uniform; 1 for values) is the initialisation of the
PPO implementations that reproduce the paper's results (see "The 37 implementation details of
PPO", Huang et al., 2022); biases start at zero.

Example:
    >>> net = mlp(4, 64, 2, out_gain=0.01)
    >>> net
    Sequential(
      (0): Linear(in_features=4, out_features=64, bias=True)
      (1): Tanh()
      (2): Linear(in_features=64, out_features=64, bias=True)
      (3): Tanh()
      (4): Linear(in_features=64, out_features=2, bias=True)
    )
    >>> bool(net[4].weight.abs().max() < 0.05), net[4].bias.abs().sum().item()
    (True, 0.0)
"""

from __future__ import annotations

import math

from torch import nn

__all__ = ["linear", "mlp"]


def linear(n_in: int, n_out: int, gain: float) -> nn.Linear:
    """A linear layer with orthogonal weights scaled by ``gain`` and zero biases."""
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def mlp(n_in: int, hidden: int, n_out: int, out_gain: float) -> nn.Sequential:
    """``n_in -> hidden -> hidden -> n_out``: two tanh hidden layers (gain ``sqrt(2)``) and a
    linear output layer with gain ``out_gain``."""
    g = math.sqrt(2)
    return nn.Sequential(
        linear(n_in, hidden, g), nn.Tanh(), linear(hidden, hidden, g), nn.Tanh(),
        linear(hidden, n_out, out_gain),
    )

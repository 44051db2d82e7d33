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

import itertools
import math

import torch
from gymnasium.spaces import Space
from torch import Tensor, nn

from rlstruct.blocks.distributions import ActionHead, CategoricalHead, make_head, space_from_spec
from rlstruct.blocks.normalization import RunningNorm

__all__ = [
    "linear", "mlp", "MLPActorCritic", "HeadActorCritic", "head_actor_critic", "conv", "nature_cnn",
    "scaled_pixels", "CNNActorCritic", "QNetwork", "TwinQ",
]


def linear(n_in: int, n_out: int, gain: float) -> nn.Linear:
    """A linear layer with orthogonal weights scaled by ``gain`` and zero biases."""
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


#: The initialisations a :class:`HeadActorCritic` may have (``init=``): orthogonal (above), or
#: torch's own defaults for ``nn.Linear`` (rl-zoo's MuJoCo PPO settings, ``ortho_init=False``).
INITS = ("orthogonal", "torch")

#: The hidden layers' activations an MLP may have (``activation=`` of :func:`mlp`).
ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def mlp(n_in: int, hidden: int, n_out: int, out_gain: float,
        activation: str = "tanh") -> nn.Sequential:
    """``n_in -> hidden -> hidden -> n_out``: two hidden layers (gain ``sqrt(2)``, ``tanh`` or
    ``relu``) and a linear output layer with gain ``out_gain``."""
    g, act = math.sqrt(2), ACTIVATIONS[activation]
    return nn.Sequential(
        linear(n_in, hidden, g), act(), linear(hidden, hidden, g), act(),
        linear(hidden, n_out, out_gain),
    )


class MLPActorCritic(nn.Module):
    """Separate actor and critic MLPs on flattened observations:
    ``forward(frame) -> (logits (n, A), value (n,))`` and ``value(frame) -> (n,)``.

    Args:
        obs_dim: flattened observation size.
        n_actions: number of discrete actions.
        hidden: width of both hidden layers of each MLP.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.actor = mlp(obs_dim, hidden, n_actions, out_gain=0.01)
        self.critic = mlp(obs_dim, hidden, 1, out_gain=1.0)

    def value(self, frame: Tensor) -> Tensor:
        """``V(frame)``, ``(n,)``."""
        return self.critic(frame.flatten(1).float()).squeeze(-1)

    def forward(self, frame: Tensor) -> tuple[Tensor, Tensor]:
        x = frame.flatten(1).float()
        return self.actor(x), self.critic(x).squeeze(-1)


class HeadActorCritic(nn.Module):
    """Separate actor and critic MLPs for any action space, the actor ending in a policy head
    (:mod:`rlstruct.blocks.distributions`): ``forward(frame) -> (params (n, P), value (n,))`` and
    ``value(frame) -> (n,)``, the interface of :class:`MLPActorCritic` with the head's params in
    place of the logits (for a categorical head they ARE the logits).

    With ``normalize_obs``, the flattened observations go through a :class:`RunningNorm`
    (``self.obs_norm``) first; its statistics are buffers of this module, so its ``state_dict``
    carries them to the workers and into checkpoints. The learner updates them
    (``model.obs_norm.update(frames)``); ``forward`` never does.

    Args:
        obs_dim: flattened observation size.
        head: the policy head; its ``n_in`` must be ``hidden``
            (e.g. ``make_head(space, hidden)``).
        hidden: width of both hidden layers of each MLP.
        normalize_obs: normalise observations with running statistics.
        activation: the hidden layers' activation, ``"tanh"`` or ``"relu"``.
        normalize_reward: keep running statistics of the discounted returns
            (``self.reward_norm``, a :class:`RunningNorm` of shape ``(1,)``), by which an
            algorithm may scale rewards (PPO's ``--normalize-reward``).
        init: ``"orthogonal"`` (gain ``sqrt(2)`` hidden, the head's own gain, 1 for the value)
            or ``"torch"``: every linear layer, the head's included, re-drawn with
            ``nn.Linear``'s default initialisation (a Gaussian head's free log-std is kept).

    Examples:
        >>> import numpy as np
        >>> from gymnasium import spaces
        >>> from rlstruct.blocks.distributions import make_head
        >>> space = spaces.Box(-2.0, 2.0, (1,), np.float32)
        >>> model = HeadActorCritic(3, make_head(space, 64), 64, normalize_obs=True)
        >>> params, value = model(torch.zeros(5, 3))
        >>> params.shape, value.shape, "obs_norm.mean" in model.state_dict()
        (torch.Size([5, 2]), torch.Size([5]), True)
    """

    def __init__(self, obs_dim: int, head: ActionHead, hidden: int, normalize_obs: bool = False,
                 activation: str = "tanh", normalize_reward: bool = False,
                 init: str = "orthogonal"):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        g, act = math.sqrt(2), ACTIVATIONS[activation]
        self.obs_norm = RunningNorm((obs_dim,)) if normalize_obs else None
        self.reward_norm = RunningNorm((1,), clip=0.0) if normalize_reward else None
        self.actor = nn.Sequential(
            linear(obs_dim, hidden, g), act(), linear(hidden, hidden, g), act(), head
        )
        self.critic = mlp(obs_dim, hidden, 1, out_gain=1.0, activation=activation)
        if init == "torch":
            for layer in self.modules():
                if isinstance(layer, nn.Linear):
                    layer.reset_parameters()

    @property
    def head(self) -> ActionHead:
        """The policy head (the actor's last module)."""
        return self.actor[-1]

    def observe(self, frame: Tensor) -> None:
        """Merges observations ``(N, *obs)`` (a batch's valid steps) into the running
        statistics; nothing without ``normalize_obs``."""
        if self.obs_norm is not None:
            self.obs_norm.update(frame.flatten(1).float())

    def features(self, frame: Tensor) -> Tensor:
        """The flattened (and normalised) float observations ``(n, obs_dim)``."""
        x = frame.flatten(1).float()
        return x if self.obs_norm is None else self.obs_norm(x)

    def value(self, frame: Tensor) -> Tensor:
        """``V(frame)``, ``(n,)``."""
        return self.critic(self.features(frame)).squeeze(-1)

    def forward(self, frame: Tensor) -> tuple[Tensor, Tensor]:
        x = self.features(frame)
        return self.actor(x), self.critic(x).squeeze(-1)



def head_actor_critic(
    obs_dim: int, action_space: dict[str, object] | Space, hidden: int, log_std_init: float = 0.0,
    normalize_obs: bool = False, activation: str = "tanh", normalize_reward: bool = False,
    init: str = "orthogonal",
) -> HeadActorCritic:
    """A :class:`HeadActorCritic` built from plain values only (``action_space`` is
    :func:`~rlstruct.blocks.distributions.space_spec` of the env's action space), so a checkpoint
    can record the call and ``rlstruct evaluate`` can repeat it.

    Examples:
        >>> from gymnasium import spaces
        >>> from rlstruct.blocks.distributions import space_spec
        >>> model = head_actor_critic(4, space_spec(spaces.Discrete(2)), 64)
        >>> model(torch.zeros(3, 4))[0].shape
        torch.Size([3, 2])
    """
    head = make_head(space_from_spec(action_space), hidden, log_std_init=log_std_init)
    return HeadActorCritic(obs_dim, head, hidden, normalize_obs, activation, normalize_reward,
                           init)


def conv(c_in: int, c_out: int, kernel: int, stride: int, gain: float = math.sqrt(2)) -> nn.Conv2d:
    """A convolution with orthogonal weights scaled by ``gain`` and zero biases."""
    layer = nn.Conv2d(c_in, c_out, kernel, stride)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def nature_cnn(in_channels: int = 4, features: int = 512) -> nn.Sequential:
    """The DQN "Nature" trunk for ``(B, C, 84, 84)`` frames: conv 32x8/4, 64x4/2, 64x3/1, ReLU,
    then a linear layer to ``features`` (ReLU). Frames are uint8 pixels: scale them first
    (:func:`scaled_pixels`).

    The convolutions' weights are channels-last (NHWC in memory; the same values and
    ``state_dict`` as NCHW), oneDNN's own layout, fed by :func:`scaled_pixels`. In float32 it
    pays: ``python benchmarks/atari.py --limit-only`` gives the training step a sample both
    ways (``train_fp32_ms`` and ``train_fp32_channels_last_ms``), and PPO's ``--preset
    atari-fast`` on Pong went from 338 to 511 steps/s (docs/guide-atari.md).

    Examples:
        >>> nature_cnn()(torch.zeros(2, 4, 84, 84)).shape
        torch.Size([2, 512])
    """
    return nn.Sequential(
        conv(in_channels, 32, 8, 4), nn.ReLU(), conv(32, 64, 4, 2), nn.ReLU(),
        conv(64, 64, 3, 1), nn.ReLU(), nn.Flatten(),
        linear(64 * 7 * 7, features, math.sqrt(2)), nn.ReLU(),
    ).to(memory_format=torch.channels_last)


def scaled_pixels(frame: Tensor) -> Tensor:
    """uint8 frames ``(B, C, H, W)`` as floats in [0, 1], channels-last in memory (the layout of
    :func:`nature_cnn`'s convolutions); a frame of another rank is only scaled.

    Examples:
        >>> x = scaled_pixels(torch.full((2, 4, 84, 84), 255, dtype=torch.uint8))
        >>> float(x.max()), x.is_contiguous(memory_format=torch.channels_last)
        (1.0, True)
    """
    pixels = frame.float() / 255.0
    return pixels.contiguous(memory_format=torch.channels_last) if pixels.dim() == 4 else pixels


class CNNActorCritic(nn.Module):
    """Actor and critic heads on one Nature-CNN trunk, for stacked Atari frames.

    ``forward(frame) -> (logits (n, A), value (n,))`` and ``value(frame) -> (n,)`` for uint8
    frames ``(n, C, 84, 84)`` (scaled to [0, 1] inside): the interface of the algorithms' MLP
    actor-critics, so ``--model cnn`` swaps it in.

    Args:
        n_actions: number of discrete actions.
        in_channels: stacked frames ``C``.
    """

    def __init__(self, n_actions: int, in_channels: int = 4) -> None:
        super().__init__()
        self.trunk = nature_cnn(in_channels)
        self.actor = CategoricalHead(512, n_actions, gain=0.01)
        self.critic = linear(512, 1, 1.0)

    @property
    def head(self) -> CategoricalHead:
        """The policy head (the actor layer: its params are the logits)."""
        return self.actor

    def _features(self, frame: Tensor) -> Tensor:
        return self.trunk(scaled_pixels(frame))

    def value(self, frame: Tensor) -> Tensor:
        """``V(frame)``, ``(n,)``."""
        x = self._features(frame)
        with torch.autocast(x.device.type, enabled=False):  # bf16 trunk, float32 heads
            return self.critic(x.float()).squeeze(-1)

    def forward(self, frame: Tensor) -> tuple[Tensor, Tensor]:
        x = self._features(frame)
        # Under --precision bf16 the trunk runs in bfloat16 and the heads in float32: the
        # logits' rounding would otherwise move PPO's ratio of a policy to itself off 1 by about
        # 1e-2, a tenth of its clip range.
        with torch.autocast(x.device.type, enabled=False):
            x = x.float()
            return self.actor(x), self.critic(x).squeeze(-1)


class QNetwork(nn.Module):
    """``Q(s, .)``: a two-layer ReLU MLP on flattened observations, or the Nature CNN on uint8
    frames ``(n, C, 84, 84)`` (``model="cnn"``, divided by 255 inside, ``in_channels`` = ``C``),
    with a plain or a dueling head.

    The CNN keeps its convolutions channels-last (:func:`nature_cnn`), and under
    ``--precision bf16`` the trunk runs in bfloat16 while the Q head stays float32 (TD errors
    are small differences of Q values)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int, dueling: bool,
                 model: str = "mlp", in_channels: int = 4) -> None:
        super().__init__()
        self.cnn = model == "cnn"
        if self.cnn:
            self.body, hidden = nature_cnn(in_channels), 512
        else:
            self.body = nn.Sequential(
                nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.advantage = nn.Linear(hidden, n_actions)
        self.value = nn.Linear(hidden, 1) if dueling else None

    def forward(self, frame: Tensor) -> Tensor:
        if self.cnn:
            x = self.body(scaled_pixels(frame))
        else:
            x = self.body(frame.flatten(1).float())
        with torch.autocast(x.device.type, enabled=False):  # the heads in float32
            x = x.float()
            if self.value is None:
                return self.advantage(x)
            advantage = self.advantage(x)
            # Subtracting the mean makes V and A identifiable (Wang et al., eq. 9).
            return self.value(x) + advantage - advantage.mean(-1, keepdim=True)


class TwinQ(nn.Module):
    """SAC's twin critics: two Q MLPs ``(s, a) -> Q_i`` evaluated as one batched network
    (``baddbmm`` over weights ``(2, in, out)``): ``forward`` gives ``(2, N)``; ``frozen=True``
    reads detached weights (gradients reach the inputs only)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int) -> None:
        super().__init__()
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for n_in, n_out in itertools.pairwise([obs_dim + act_dim, hidden, hidden, 1]):
            bound = 1 / math.sqrt(n_in)  # nn.Linear's default initialisation, per critic
            self.weights.append(nn.Parameter(torch.empty(2, n_in, n_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(2, 1, n_out).uniform_(-bound, bound)))

    def forward(self, frame: Tensor, action: Tensor, frozen: bool = False) -> Tensor:
        x = torch.cat([frame.flatten(1).float(), action.float()], -1).expand(2, -1, -1)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            w, b = (w.detach(), b.detach()) if frozen else (w, b)
            x = torch.baddbmm(b, x if i == 0 else torch.relu(x), w)
        return x.squeeze(-1)

"""Policy heads: one interface over categorical, Gaussian and tanh-squashed Gaussian policies.

A head is a ``torch.nn.Module`` that maps features ``(n, F)`` to the distribution's parameters,
ONE plain tensor ``params`` ``(n, P)`` (the logits; or the mean and log-std side by side). Every
other method takes ``params`` back, so an agent stores plain tensors in its outputs (a
DictTensor) and a loss rebuilds the same distribution from the replayed network outputs:

- ``sample(params, generator)``: the head's own sample (int64 ``(n,)`` for categorical heads;
  ``(n, D)`` for Gaussian ones, reparameterised: it carries gradients to ``params``);
  ``params`` ``(n, P)`` when acting; every other method also takes leading dims ``(B, T, P)``;
- ``log_prob(params, sample)``, ``entropy(params)`` (a one-sample estimate for the squashed
  head, which has no closed form), ``greedy(params)`` (the mode, in the sample's space),
  ``kl(p, q)`` (``KL(p || q)`` per row, exact for every head);
- ``to_env(sample)``: the action the env receives, inside its action space;
- ``act(params, generator, greedy)``: ``(sample, env action)``, with the greedy action on the
  rows that ``agent_info["greedy"]`` marks.

Store the SAMPLE for the log-prob, never the env action: the unsquashed Gaussian lives in a
normalised space (``[-1, 1]`` is the Box) and ``to_env`` rescales and CLIPS it at the Box bounds;
a log-prob taken at the clipped action would bias PPO's ratio. The squashed head's sample is the
pre-tanh ``u`` (``tanh`` then rescales ``(-1, 1)`` to the bounds), which keeps its log-prob exact
where ``atanh`` of a rounded action would not be.

Example:
    >>> import numpy as np
    >>> from gymnasium import spaces
    >>> head = make_head(spaces.Box(-2.0, 2.0, (1,), np.float32), n_in=8)
    >>> params = head(torch.zeros(3, 8))  # mean 0, log-std 0 in the normalised space
    >>> params.shape
    torch.Size([3, 2])
    >>> sample, action = head.act(params, torch.Generator().manual_seed(0))
    >>> bool(action.abs().max() <= 2.0), head.log_prob(params, sample).shape
    (True, torch.Size([3]))
    >>> head.act(params, greedy=torch.ones(3, dtype=torch.bool))[1].tolist()
    [[0.0], [0.0], [0.0]]
"""

from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

from rlstruct.errors import ConfigError, SpaceError

__all__ = [
    "ActionHead", "CategoricalHead", "GaussianHead", "TanhGaussianHead", "make_head", "space_spec",
    "space_from_spec",
]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_LOG2 = math.log(2.0)


def _linear(n_in: int, n_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActionHead(nn.Module):
    """The interface every head implements (see the module docstring).

    ``forward(features (n, F)) -> params (n, P)``.
    """

    def sample(self, params: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One sample per row, from ``generator`` (torch's global RNG when ``None``)."""
        raise NotImplementedError

    def log_prob(self, params: Tensor, sample: Tensor) -> Tensor:
        """``log pi(sample)`` per row, ``(n,)``."""
        raise NotImplementedError

    def entropy(self, params: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The entropy per row, ``(n,)`` (``generator`` only for heads that estimate it)."""
        raise NotImplementedError

    def greedy(self, params: Tensor) -> Tensor:
        """The mode of each row, in the sample's space (what evaluation plays)."""
        raise NotImplementedError

    def kl(self, p: Tensor, q: Tensor) -> Tensor:
        """``KL(pi_p || pi_q)`` per row, ``(n,)``, for two heads' params of equal shape."""
        raise NotImplementedError

    def to_env(self, sample: Tensor) -> Tensor:
        """The env's action for each sample, inside the action space (default: the sample)."""
        return sample

    def act(
        self,
        params: Tensor,
        generator: torch.Generator | None = None,
        greedy: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(sample, env action)`` for each row of ``params``.

        Args:
            params: ``(n, P)``, this head's output.
            generator: the random stream (on ``params``' device); ``None``: torch's global RNG.
            greedy: bool ``(n,)`` on any device: rows that play :meth:`greedy` instead.
        """
        sample = self.sample(params, generator)
        if greedy is not None:
            mask = greedy.to(params.device).view(-1, *([1] * (sample.dim() - 1)))
            sample = torch.where(mask, self.greedy(params), sample)
        return sample, self.to_env(sample)


class CategoricalHead(ActionHead):
    """``softmax(logits)`` over ``Discrete(n, start)``: params are the logits ``(n, A)``.

    Samples are int64 indices ``(n,)`` drawn with ``torch.multinomial`` (the draws of
    :class:`rlstruct.blocks.sampling.CategoricalSampler` for the same generator); the env receives
    ``start + index``.

    Args:
        n_in: feature size.
        n_actions: number of actions ``A``.
        start: the ``Discrete`` space's first action.
        gain: orthogonal gain of the logits layer (0.01: a near-uniform start).
    """

    def __init__(self, n_in: int, n_actions: int, start: int = 0, gain: float = 0.01) -> None:
        super().__init__()
        self.logits = _linear(n_in, n_actions, gain)
        self.start = int(start)

    def forward(self, features: Tensor) -> Tensor:
        return self.logits(features)

    def sample(self, params: Tensor, generator: torch.Generator | None = None) -> Tensor:
        probs = params.detach().softmax(-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    def log_prob(self, params: Tensor, sample: Tensor) -> Tensor:
        return params.log_softmax(-1).gather(-1, sample.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self, params: Tensor, generator: torch.Generator | None = None) -> Tensor:
        logp = params.log_softmax(-1)
        return -(logp.exp() * logp).sum(-1)

    def greedy(self, params: Tensor) -> Tensor:
        return params.argmax(-1)

    def kl(self, p: Tensor, q: Tensor) -> Tensor:
        logp, logq = p.log_softmax(-1), q.log_softmax(-1)
        return (logp.exp() * (logp - logq)).sum(-1)

    def to_env(self, sample: Tensor) -> Tensor:
        return sample + self.start if self.start else sample


class GaussianHead(ActionHead):
    """A diagonal Gaussian over a ``Box((D,))``: params ``(n, 2D)`` = ``[mean, log_std]``.

    The Gaussian lives in a normalised space: the env receives ``clip(loc + scale * sample,
    low, high)`` with ``loc``, ``scale`` the centre and half-width of the Box (0 and 1 on
    unbounded dimensions, which are not clipped). Store the unclipped ``sample``.

    Args:
        n_in: feature size.
        space: the ``Box`` action space, of shape ``(D,)``.
        state_dependent_std: the log-std is a second output layer of the features; otherwise
            (default) one free parameter per dimension, shared by every state (PPO, TRPO).
        log_std_init: the initial log-std.
        log_std_bounds: the log-std of a state-dependent head is clamped into these bounds.
        gain: orthogonal gain of the mean layer.
    """

    def __init__(
        self,
        n_in: int,
        space: spaces.Box,
        state_dependent_std: bool = False,
        log_std_init: float = 0.0,
        log_std_bounds: tuple[float, float] = (-20.0, 2.0),
        gain: float = 0.01,
    ) -> None:
        super().__init__()
        low, high = _box_bounds(space)
        self.n_dims = low.numel()
        self.action_dtype = torch.from_numpy(np.zeros(0, dtype=space.dtype)).dtype
        bounded = torch.isfinite(low) & torch.isfinite(high)
        loc = torch.where(bounded, (high + low) / 2, torch.zeros_like(low))
        scale = torch.where(bounded, (high - low) / 2, torch.ones_like(low))
        for name, value in (("low", low), ("high", high), ("loc", loc), ("scale", scale)):
            self.register_buffer(name, value, persistent=False)
        self.mean = _linear(n_in, self.n_dims, gain)
        self.state_dependent_std = bool(state_dependent_std)
        self.log_std_bounds = log_std_bounds
        if self.state_dependent_std:
            self.log_std = _linear(n_in, self.n_dims, gain)
            nn.init.constant_(self.log_std.bias, log_std_init)
        else:
            self.log_std = nn.Parameter(torch.full((self.n_dims,), float(log_std_init)))

    def forward(self, features: Tensor) -> Tensor:
        mean = self.mean(features)
        if self.state_dependent_std:
            log_std = self.log_std(features).clamp(*self.log_std_bounds)
        else:
            log_std = self.log_std.expand_as(mean)
        return torch.cat((mean, log_std), dim=-1)

    def split(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """``(mean, log_std)``, each ``(n, D)``."""
        return params[..., : self.n_dims], params[..., self.n_dims :]

    def sample(self, params: Tensor, generator: torch.Generator | None = None) -> Tensor:
        mean, log_std = self.split(params)
        noise = torch.randn(
            mean.shape, generator=generator, device=mean.device, dtype=mean.dtype
        )
        return mean + log_std.exp() * noise

    def log_prob(self, params: Tensor, sample: Tensor) -> Tensor:
        mean, log_std = self.split(params)
        z = (sample - mean) * (-log_std).exp()
        return (-0.5 * z.square() - log_std - _LOG_SQRT_2PI).sum(-1)

    def entropy(self, params: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return (self.split(params)[1] + 0.5 + _LOG_SQRT_2PI).sum(-1)

    def greedy(self, params: Tensor) -> Tensor:
        return self.split(params)[0]

    def kl(self, p: Tensor, q: Tensor) -> Tensor:
        mean_p, log_std_p = self.split(p)
        mean_q, log_std_q = self.split(q)
        var_ratio = (2 * (log_std_p - log_std_q)).exp()
        t = ((mean_p - mean_q) * (-log_std_q).exp()).square()
        return (0.5 * (var_ratio + t - 1) - (log_std_p - log_std_q)).sum(-1)

    def to_env(self, sample: Tensor) -> Tensor:
        action = self.loc + self.scale * sample.detach()
        return torch.maximum(torch.minimum(action, self.high), self.low).to(self.action_dtype)


class TanhGaussianHead(GaussianHead):
    """A tanh-squashed diagonal Gaussian over a bounded ``Box((D,))`` (SAC's policy).

    The sample is the Gaussian's ``u``; the action is ``a = tanh(u)`` in ``(-1, 1)``, rescaled to
    the bounds by ``to_env`` (:meth:`squash` gives ``a`` itself, with gradients, for a Q-network).
    ``log pi(a) = log N(u) - sum_i log(1 - tanh(u_i)^2)`` (change of variables), computed as
    ``2 (log 2 - u - softplus(-2 u))``, stable for large ``|u|``. The entropy has no closed form:
    :meth:`entropy` is ``-log pi`` of one reparameterised sample (an unbiased estimate). The KL
    equals the Gaussians' (it is invariant under the bijection ``tanh``). The log-std is
    state-dependent by default.
    """

    def __init__(
        self,
        n_in: int,
        space: spaces.Box,
        state_dependent_std: bool = True,
        log_std_init: float = 0.0,
        log_std_bounds: tuple[float, float] = (-20.0, 2.0),
        gain: float = 0.01,
    ) -> None:
        super().__init__(n_in, space, state_dependent_std, log_std_init, log_std_bounds, gain)
        if not bool((torch.isfinite(self.low) & torch.isfinite(self.high)).all()):
            raise SpaceError(
                f"a tanh-squashed head needs a bounded Box, got {space!r}; use GaussianHead "
                "(squash=False) for unbounded actions"
            )

    @staticmethod
    def squash(sample: Tensor) -> Tensor:
        """``tanh(u)``: the action in ``(-1, 1)``, differentiable."""
        return torch.tanh(sample)

    def log_prob(self, params: Tensor, sample: Tensor) -> Tensor:
        log_det = 2 * (_LOG2 - sample - nn.functional.softplus(-2 * sample))
        return super().log_prob(params, sample) - log_det.sum(-1)

    def entropy(self, params: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return -self.log_prob(params, self.sample(params, generator))

    def to_env(self, sample: Tensor) -> Tensor:
        return super().to_env(torch.tanh(sample))


def _box_bounds(space: spaces.Box) -> tuple[Tensor, Tensor]:
    if len(space.shape) != 1 or not np.issubdtype(space.dtype, np.floating):
        raise SpaceError(
            f"Gaussian heads take a float Box of shape (D,), got {space!r}; flatten the actions "
            "with a gymnasium.ActionWrapper"
        )
    as_tensor = lambda x: torch.as_tensor(np.asarray(x, dtype=space.dtype))  # noqa: E731
    return as_tensor(space.low), as_tensor(space.high)


def make_head(
    space: spaces.Space,
    n_in: int,
    *,
    squash: bool = False,
    state_dependent_std: bool | None = None,
    log_std_init: float = 0.0,
    gain: float = 0.01,
) -> ActionHead:
    """The head for a gymnasium action space.

    ``Discrete`` gives a :class:`CategoricalHead`; a float ``Box((D,))`` a :class:`GaussianHead`
    (state-independent log-std by default) or, with ``squash``, a :class:`TanhGaussianHead`
    (state-dependent log-std by default).

    Args:
        space: the single-env action space.
        n_in: the feature size the head reads.
        squash: tanh-squash a Box policy (needs finite bounds).
        state_dependent_std: override the Gaussian heads' default log-std kind.
        log_std_init: the initial log-std of a Gaussian head.
        gain: orthogonal gain of the output layer.

    Raises:
        SpaceError: any other space (MultiDiscrete, a Box of rank != 1, an integer Box...).
        ConfigError: ``squash`` for a Discrete space.
    """
    if isinstance(space, spaces.Discrete):
        if squash:
            raise ConfigError(f"squash=True needs a Box action space, got {space!r}")
        return CategoricalHead(n_in, int(space.n), int(space.start), gain)
    if isinstance(space, spaces.Box):
        kind = TanhGaussianHead if squash else GaussianHead
        sd = squash if state_dependent_std is None else state_dependent_std
        return kind(n_in, space, sd, log_std_init, gain=gain)
    raise SpaceError(
        f"no policy head for the action space {space!r}: heads exist for Discrete and for a "
        "float Box of shape (D,)"
    )


def space_spec(space: spaces.Space) -> dict[str, object]:
    """An action space as plain values (what a checkpoint's recorded constructor call may hold):
    ``{"n": n, "start": start}`` for ``Discrete``, ``{"low": [...], "high": [...], "dtype": ...}``
    for a ``Box``; :func:`space_from_spec` rebuilds it.

    Raises:
        SpaceError: another kind of space.

    Examples:
        >>> space_from_spec(space_spec(spaces.Discrete(3)))
        Discrete(3)
        >>> space_from_spec(space_spec(spaces.Box(-2.0, 2.0, (1,), np.float32)))
        Box(-2.0, 2.0, (1,), float32)
    """
    if isinstance(space, spaces.Discrete):
        return {"n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        return {"low": np.asarray(space.low).tolist(), "high": np.asarray(space.high).tolist(),
                "dtype": str(space.dtype)}
    raise SpaceError(f"no plain description of the action space {space!r} (Discrete or Box)")


def space_from_spec(spec: dict[str, object] | spaces.Space) -> spaces.Space:
    """The action space :func:`space_spec` described (a space given as it is is returned)."""
    if isinstance(spec, spaces.Space):
        return spec
    if "n" in spec:
        return spaces.Discrete(int(spec["n"]), start=int(spec.get("start", 0)))  # type: ignore[arg-type]
    dtype = np.dtype(str(spec.get("dtype", "float32")))
    low, high = np.asarray(spec["low"], dtype=dtype), np.asarray(spec["high"], dtype=dtype)
    return spaces.Box(low, high, dtype=dtype)

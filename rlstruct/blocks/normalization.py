"""Running observation normalisation whose statistics travel with the weights.

:class:`RunningNorm` is a ``torch.nn.Module`` whose running mean, variance and count are
BUFFERS: put it inside the model, and ``model.state_dict()`` carries them, so
``batcher.update(model.state_dict())`` sends them to the workers with the weights (collection and
learning normalise alike) and the checkpoint saves them. Only the learner calls :meth:`update`,
on the observations of each collected batch (valid steps only); ``forward`` never changes them.

The statistics merge batch by batch with the parallel form of Welford's algorithm (Chan et al.,
1979), in float64: after any number of batches they are the mean and the population variance
(``ddof=0``) of every row seen.

Example:
    >>> norm = RunningNorm((2,))
    >>> norm.update(torch.tensor([[0.0, 10.0], [2.0, 10.0]]))
    >>> norm.update(torch.tensor([[4.0, 10.0]]))
    >>> norm.mean.tolist(), norm.var.tolist(), int(norm.count)
    ([2.0, 10.0], [2.6666666666666665, 0.0], 3)
    >>> norm(torch.tensor([[2.0, 10.0]]))
    tensor([[0., 0.]])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rlstruct.errors import ConfigError, ShapeError

__all__ = ["RunningNorm"]


class RunningNorm(nn.Module):
    """``clamp((x - mean) / sqrt(var + eps), -clip, clip)`` with running ``mean`` and ``var``.

    Before the first :meth:`update` the mean is 0 and the variance 1 (the identity, clipped).

    Args:
        shape: the per-row feature shape ``(*feat)``.
        eps: added to the variance (constant dimensions map to 0, not to NaN).
        clip: the normalised values are clipped to ``[-clip, clip]``; 0: no clipping.
    """

    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(self, shape: Sequence[int] | int, eps: float = 1e-8, clip: float = 10.0) -> None:
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        if eps <= 0 or clip < 0:
            raise ConfigError(f"RunningNorm needs eps > 0 and clip >= 0, got {eps} and {clip}")
        self.shape, self.eps, self.clip = shape, float(eps), float(clip)
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Merges the rows of ``x`` ``(N, *feat)`` into the statistics (no-op for ``N = 0``).

        Raises:
            ShapeError: ``x``'s trailing shape is not ``shape``.
        """
        if tuple(x.shape[1:]) != self.shape:
            raise ShapeError(
                f"RunningNorm.update: x has shape {tuple(x.shape)}, expected (N, *{self.shape})"
            )
        n = x.shape[0]
        if n == 0:
            return
        x = x.to(device=self.mean.device, dtype=torch.float64)
        batch_mean = x.mean(0)
        batch_var = x.var(0, correction=0)
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * (n / total)
        m2 = self.var * self.count + batch_var * n + delta.square() * (self.count * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: Tensor) -> Tensor:
        """``x`` ``(n, *feat)`` normalised, in ``x``'s dtype (integer inputs give float32)."""
        dtype = x.dtype if x.is_floating_point() else torch.float32
        y = (x.to(dtype) - self.mean.to(dtype)) * torch.rsqrt(self.var + self.eps).to(dtype)
        if self.clip > 0:
            y = y.clamp(-self.clip, self.clip)
        return y.to(dtype)


@torch.no_grad()
def scale_rewards(
    norm: RunningNorm, running: Tensor | None, reward: Tensor, done: Tensor, lengths: Tensor,
    gamma: float, clip: float = 10.0,
) -> tuple[Tensor, Tensor]:
    """Rewards divided by the running std of the discounted returns (what rl-zoo's
    ``VecNormalize`` does to rewards), for one batch of auto-reset segments.

    Each env row's return ``G <- gamma G + r`` runs on across batches and restarts after an
    episode's end; every valid step's ``G`` updates ``norm`` first, then the rewards are scaled.

    Args:
        norm: the statistics of the returns, shape ``(1,)``.
        running: each row's return at the end of the previous batch ``(B,)`` (None: zeros).
        reward: ``(B, T)``.
        done: ``(B, T)`` bool, the episode ended at that step (terminated or truncated).
        lengths: ``(B,)`` valid steps per row.
        gamma: the discount.
        clip: the scaled rewards are clipped to ``[-clip, clip]``.

    Returns:
        ``(scaled rewards (B, T), each row's return for the next batch (B,))``.
    """
    if running is None or running.shape != reward.shape[:1]:
        running = torch.zeros_like(reward[:, 0])
    returns = []
    for t in range(reward.shape[1]):
        valid = t < lengths
        running = torch.where(valid, running * gamma + reward[:, t], running)
        returns.append(running[valid])
        running = torch.where(valid & done[:, t], torch.zeros_like(running), running)
    norm.update(torch.cat(returns).unsqueeze(1))
    scale = torch.rsqrt(norm.var + norm.eps).to(reward.dtype)
    return (reward * scale).clamp(-clip, clip), running

"""The terms of policy updates: a categorical policy's log-probability and entropy, and the
conjugate-gradient solve of TRPO's natural gradient.

The first two work on logits ``(*batch, A)`` of any batch shape, on any device, with gradients
flowing into the logits; :func:`conjugate_gradient` works on flat parameter vectors ``(D,)``.
All three are re-exported by :mod:`rlstruct.blocks.functional` (``F.categorical_entropy``...).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlstruct.errors import ConfigError, ShapeError

__all__ = ["categorical_log_prob", "categorical_entropy", "conjugate_gradient"]


def categorical_log_prob(logits: Tensor, action: Tensor) -> Tensor:
    """``log softmax(logits)[action]``: the log-probability of the taken actions.

    Args:
        logits: ``(*batch, A)`` unnormalised log-probabilities (log-probabilities work too).
        action: ``(*batch,)`` int64 action indices.

    Returns:
        ``(*batch,)``, with gradients flowing into ``logits``.

    Examples:
        >>> categorical_log_prob(torch.zeros(2, 4), torch.tensor([0, 3])).exp()
        tensor([0.2500, 0.2500])
    """
    return logits.log_softmax(-1).gather(-1, action.unsqueeze(-1)).squeeze(-1)


def categorical_entropy(logits: Tensor) -> Tensor:
    """``H = -sum_a p(a) log p(a)`` of ``p = softmax(logits)`` over the last dim.

    Actions with probability 0 (``-inf`` logits, e.g. masked actions) contribute 0, not NaN.

    Args:
        logits: ``(*batch, A)`` unnormalised log-probabilities (log-probabilities work too:
            ``log_softmax`` leaves them unchanged).

    Returns:
        ``(*batch,)``, with gradients flowing into ``logits``.

    Examples:
        >>> categorical_entropy(torch.tensor([[0.0, 0.0], [0.0, -float("inf")]]))  # log 2, 0
        tensor([0.6931, 0.0000])
    """
    log_probs = logits.log_softmax(-1)
    probs = log_probs.exp()
    return (probs * (-log_probs).masked_fill(probs == 0, 0.0)).sum(-1)  # +0 for a certain choice


def conjugate_gradient(
    matvec: Callable[[Tensor], Tensor], b: Tensor, n_iters: int = 10, tol: float = 1e-10
) -> Tensor:
    """Solves ``A x = b`` for a symmetric positive-definite ``A`` known only by ``x -> A x``.

    TRPO's natural gradient ``F^-1 g`` uses it with Fisher-vector products, never forming ``F``.
    Starts from ``x = 0``; stops after ``n_iters`` iterations or once the squared residual norm
    is below ``tol``. Exact in at most ``len(b)`` iterations (in exact arithmetic).

    Args:
        matvec: ``v (D,) -> A v (D,)``.
        b: the right-hand side ``(D,)``.
        n_iters: at most this many iterations (>= 1).
        tol: the squared residual norm at which to stop (>= 0).

    Returns:
        ``x`` ``(D,)``, detached from any graph of ``b``.

    Examples:
        >>> A = torch.tensor([[4.0, 1.0], [1.0, 3.0]])
        >>> conjugate_gradient(lambda v: A @ v, torch.tensor([1.0, 2.0]), n_iters=2)
        tensor([0.0909, 0.6364])
    """
    if n_iters < 1 or not tol >= 0:
        raise ConfigError(
            f"conjugate_gradient needs n_iters >= 1 and tol >= 0, got {n_iters} and {tol}"
        )
    if b.dim() != 1:
        raise ShapeError(f"b must be 1-D (D,), got shape {tuple(b.shape)}")
    b = b.detach()
    x = torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    rr = r.dot(r)
    for _ in range(n_iters):
        if rr <= tol:
            break
        ap = matvec(p).detach()
        alpha = rr / p.dot(ap)
        x += alpha * p
        r -= alpha * ap
        rr_new = r.dot(r)
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x

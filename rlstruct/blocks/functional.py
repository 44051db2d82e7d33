"""Return, target and advantage estimators over (B, T) trajectory segments, and the terms of
the policy losses (advantage normalisation, a categorical policy's log-probability and entropy).

Conventions: batch first, time second. ``lengths`` (B,) says how many leading steps of each row
are valid; steps ``t >= lengths[b]`` are padding, never influence a result and come out as 0 (even
if they hold garbage such as 1e9, inf or NaN). ``terminated`` / ``truncated`` flag the transition
at ``t`` (gymnasium semantics; bool or 0/1 numbers, nonzero counts as true; a step with both set
counts as terminated). ``next_value[:, t]`` is V(s'_t), the value of the observation reached by
the action at ``t`` -- for a done step the TRUE final observation, not the reset one. A done step
in the middle of a row ends the episode (an auto-reset env starts a new one at ``t + 1``), so every
recursion stops there; the last valid step of a row that is not done is a segment cut and
bootstraps from ``next_value``. All functions are vectorised over B and run on any device/dtype.
The policy terms (``categorical_log_prob``, ``categorical_entropy``, and ``conjugate_gradient``,
TRPO's natural-gradient solve) live in :mod:`rlstruct.blocks.policy_terms`, V-trace
(``vtrace``, ``VTrace``) in :mod:`rlstruct.blocks.vtrace` and ``valid_mask`` with the checks the
estimators share in :mod:`rlstruct.blocks.segments`; all are re-exported here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlstruct.blocks.policy_terms import (
    categorical_entropy,
    categorical_log_prob,
    conjugate_gradient,
)
from rlstruct.blocks.segments import (
    as_flag,
    check_lengths,
    check_like,
    check_reward,
    check_unit,
    reverse_scan,
    segment_masks,
    valid_mask,
)
from rlstruct.blocks.vtrace import VTrace, vtrace
from rlstruct.errors import ConfigError, ShapeError

__all__ = [
    "VTrace",
    "categorical_entropy",
    "categorical_log_prob",
    "conjugate_gradient",
    "clipped_surrogate",
    "discounted_returns",
    "gae",
    "masked_mean",
    "n_step_returns",
    "normalize_advantages",
    "td_targets",
    "valid_mask",
    "vtrace",
]


def masked_mean(
    x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None, keepdim: bool = False
) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is true.

    Masked-out entries never influence the result (even if NaN); an empty selection gives 0.

    Args:
        x: floating tensor of any shape, e.g. (B, T).
        mask: bool (or 0/1) tensor broadcastable to ``x.shape``.
        dim: None to reduce over everything (scalar), or the dim(s) to reduce.
        keepdim: keep the reduced dims with size 1 (only when ``dim`` is given).

    Returns:
        The masked mean, a 0-dim tensor or ``x`` reduced along ``dim``.

    Examples:
        >>> x = torch.tensor([[1.0, 2.0, 9.0], [4.0, 0.0, 0.0]])
        >>> m = torch.tensor([[True, True, False], [False, False, False]])
        >>> masked_mean(x, m)
        tensor(1.5000)
        >>> masked_mean(x, m, dim=1)
        tensor([1.5000, 0.0000])
    """
    try:
        ok = torch.broadcast_shapes(mask.shape, x.shape) == x.shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ShapeError(
            f"mask has shape {tuple(mask.shape)}, expected one broadcastable to {tuple(x.shape)}"
            " like x"
        )
    m = (mask if mask.dtype == torch.bool else mask != 0).expand(x.shape)
    num = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    count = m.to(x.dtype)
    if dim is None:
        return num.sum() / count.sum().clamp(min=1)
    return num.sum(dim, keepdim=keepdim) / count.sum(dim, keepdim=keepdim).clamp(min=1)


def normalize_advantages(x: Tensor, mask: Tensor | None = None, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / (std + eps)`` over the valid entries: the step size of a policy gradient
    no longer depends on the scale of the rewards.

    Mean and (population) standard deviation are taken over the entries where ``mask`` is true,
    or over all of ``x`` without a mask (a minibatch of transitions). Masked-out entries never
    influence the statistics (even if NaN) and are transformed like the others.

    Args:
        x: floating tensor, e.g. ``(B, T)`` advantages or ``(N,)`` for transitions.
        mask: bool tensor broadcastable to ``x.shape`` (e.g. ``valid_mask``), or None.
        eps: added to the standard deviation (a constant ``x`` comes out as 0).

    Returns:
        A tensor like ``x``; gradients flow through mean and std.

    Examples:
        >>> x = torch.tensor([[1.0, 3.0, 1e9]])
        >>> normalize_advantages(x, torch.tensor([[True, True, False]]))[:, :2].tolist()
        [[-1.0, 1.0]]
        >>> normalize_advantages(torch.tensor([2.0, 4.0])).tolist()
        [-1.0, 1.0]
    """
    if eps < 0:
        raise ConfigError(f"eps must be >= 0, got {eps}")
    if mask is None:
        return (x - x.mean()) / (x.std(correction=0) + eps)
    mean = masked_mean(x, mask)
    std = masked_mean((x - mean).square(), mask).sqrt()
    return (x - mean) / (std + eps)


def discounted_returns(
    reward: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    lengths: Tensor,
    gamma: float,
    next_value: Tensor | None = None,
) -> Tensor:
    """Discounted (Monte-Carlo) returns within each episode of each row.

    ``G_t = r_t`` if terminated at t; ``r_t + gamma * V'_t`` if truncated at t or t is the row's
    last valid step (segment cut); else ``r_t + gamma * G_{t+1}``. With ``next_value=None``,
    ``V'`` is taken as 0: a caller who wants truncated episodes and segment cuts to bootstrap
    must pass ``next_value``.

    Args:
        reward: (B, T) rewards.
        terminated: (B, T) flags, the episode really ended at t (no bootstrap).
        truncated: (B, T) flags, the episode was cut at t (bootstrap from ``next_value``).
        lengths: (B,) integer valid lengths, in [0, T].
        gamma: discount in [0, 1].
        next_value: optional (B, T) V(s'_t), the value of the true next observation.

    Returns:
        (B, T) returns, 0 on padding.

    Examples:
        >>> r = torch.ones(1, 3)
        >>> f = torch.tensor([[False, False, True]])
        >>> discounted_returns(r, f, torch.zeros_like(f), torch.tensor([3]), 0.9)
        tensor([[2.7100, 1.9000, 1.0000]])
    """
    gamma = check_unit("gamma", gamma)
    term, valid, cont = segment_masks(reward, terminated, truncated, lengths)
    zero = torch.zeros((), dtype=reward.dtype, device=reward.device)
    base = torch.where(valid, reward, zero)
    if next_value is not None:
        check_like("next_value", next_value, reward)
        base = base + gamma * torch.where(valid & ~term & ~cont, next_value, zero)
    return reverse_scan(base, gamma * cont.to(base.dtype))


def td_targets(
    reward: Tensor,
    next_value: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    *,
    lengths: Tensor | None = None,
) -> Tensor:
    """One-step TD targets ``r + gamma * (1 - terminated) * V'``.

    ``truncated`` is accepted for a uniform signature but does not change a one-step target:
    ``next_value`` is already the value of the true final observation, so a truncated step
    bootstraps from it exactly like an ordinary step; only termination (absorbing state, value 0)
    removes the bootstrap.

    Args:
        reward: (B, T) rewards.
        next_value: (B, T) V(s'_t), the value of the true next observation.
        terminated: (B, T) termination flags.
        truncated: (B, T) truncation flags (checked for shape, otherwise unused).
        gamma: discount in [0, 1].
        lengths: optional (B,) valid lengths; padding steps are then set to 0.

    Returns:
        (B, T) targets.

    Examples:
        >>> r, v = torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0, 2.0]])
        >>> td_targets(r, v, torch.tensor([[False, True]]), torch.zeros(1, 2), 0.5)
        tensor([[2., 1.]])
    """
    gamma = check_unit("gamma", gamma)
    check_reward(reward)
    check_like("next_value", next_value, reward)
    term = as_flag("terminated", terminated, reward)
    as_flag("truncated", truncated, reward)
    zero = torch.zeros((), dtype=reward.dtype, device=reward.device)
    out = reward + gamma * torch.where(term, zero, next_value)
    if lengths is not None:
        batch, time = reward.shape
        valid = valid_mask(check_lengths(lengths, batch, time).to(reward.device), time)
        out = torch.where(valid, out, zero)
    return out


def n_step_returns(
    reward: Tensor,
    next_value: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    lengths: Tensor,
    gamma: float,
    n: int,
) -> Tensor:
    """n-step bootstrapped returns.

    From each valid t, sum ``gamma^k r_{t+k}`` for up to n rewards, stopping early at a done step
    or at the row's last valid step; at the stop step s (after m rewards) add
    ``gamma^m (1 - terminated_s) V'_s``. ``n=1`` equals :func:`td_targets` on valid steps and
    ``n >= T`` equals :func:`discounted_returns` with ``next_value``. Loops over ``min(n, T)``.

    Args:
        reward: (B, T) rewards.
        next_value: (B, T) V(s'_t), the value of the true next observation.
        terminated: (B, T) termination flags.
        truncated: (B, T) truncation flags.
        lengths: (B,) integer valid lengths, in [0, T].
        gamma: discount in [0, 1].
        n: number of steps, >= 1.

    Returns:
        (B, T) returns, 0 on padding.

    Examples:
        >>> r, v, f = torch.ones(1, 3), torch.full((1, 3), 10.0), torch.zeros(1, 3)
        >>> n_step_returns(r, v, f, f, torch.tensor([3]), 0.5, 2)
        tensor([[4., 4., 6.]])
    """
    gamma = check_unit("gamma", gamma)
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ConfigError(f"n must be an integer >= 1, got {n!r}")
    term, valid, cont = segment_masks(reward, terminated, truncated, lengths)
    check_like("next_value", next_value, reward)
    time = reward.shape[1]
    steps = min(int(n), time)
    zero = torch.zeros((), dtype=reward.dtype, device=reward.device)
    pad = max(steps - 1, 0)
    r = torch.nn.functional.pad(torch.where(valid, reward, zero), (0, pad))
    boot = torch.nn.functional.pad(torch.where(valid & ~term, next_value, zero), (0, pad))
    stop = torch.nn.functional.pad(~cont, (0, pad), value=True)
    out = torch.zeros_like(r[:, :time])
    alive = valid
    disc = 1.0
    for k in range(steps):
        out = out + torch.where(alive, disc * r[:, k : k + time], zero)
        disc *= gamma
        stop_k = stop[:, k : k + time] if k < steps - 1 else torch.ones_like(alive)
        out = out + torch.where(alive & stop_k, disc * boot[:, k : k + time], zero)
        alive = alive & ~stop_k
    return out


def gae(
    reward: Tensor, value: Tensor, next_value: Tensor, terminated: Tensor, truncated: Tensor,
    lengths: Tensor, gamma: float, lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation (Schulman et al., 2016).

    ``delta_t = r_t + gamma (1 - terminated_t) V'_t - V_t`` and
    ``A_t = delta_t + gamma lam (1 - done_t) [t + 1 valid] A_{t+1}``. Normally
    ``next_value[:, t] == value[:, t + 1]`` inside an episode; passing both lets truncated
    steps and segment cuts bootstrap from the true final observation. ``lam=0`` gives
    ``td_targets - value``; ``lam=1`` gives Monte-Carlo returns minus ``value``.

    Args:
        reward: (B, T) rewards.
        value: (B, T) V(s_t).
        next_value: (B, T) V(s'_t), the value of the true next observation.
        terminated: (B, T) termination flags.
        truncated: (B, T) truncation flags.
        lengths: (B,) integer valid lengths, in [0, T].
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1].

    Returns:
        ``(advantages, returns)``, each (B, T), with ``returns = advantages + value`` on valid
        steps and both 0 on padding.

    Examples:
        >>> r, v, nv = torch.ones(1, 2), torch.zeros(1, 2), torch.zeros(1, 2)
        >>> f = torch.zeros(1, 2, dtype=torch.bool)
        >>> adv, ret = gae(r, v, nv, f, f, torch.tensor([2]), 0.5, 1.0)
        >>> adv
        tensor([[1.5000, 1.0000]])
    """
    gamma = check_unit("gamma", gamma)
    lam = check_unit("lam", lam)
    term, valid, cont = segment_masks(reward, terminated, truncated, lengths)
    check_like("value", value, reward)
    check_like("next_value", next_value, reward)
    zero = torch.zeros((), dtype=reward.dtype, device=reward.device)
    delta = reward + gamma * torch.where(term, zero, next_value) - value
    delta = torch.where(valid, delta, zero)
    adv = reverse_scan(delta, (gamma * lam) * cont.to(delta.dtype))
    return adv, torch.where(valid, adv + value, zero)


def clipped_surrogate(logp: Tensor, logp_old: Tensor, advantage: Tensor, clip: float) -> Tensor:
    """PPO's clipped surrogate loss per sample (Schulman et al., 2017), to be minimised.

    With the probability ratio ``r = exp(logp - logp_old)``::

        loss = -min(r A, clip(r, 1 - clip, 1 + clip) A)

    so a step that already moved ``r`` past ``1 + clip`` (for ``A > 0``) or below ``1 - clip``
    (for ``A < 0``) gets no more gradient from that sample, while a move in the harmful
    direction is never clipped. The gradient flows through ``logp`` only.

    Args:
        logp: ``(*batch)`` log-probabilities of the taken actions under the policy being learned.
        logp_old: ``(*batch)`` the same under the policy the trust region is centred on.
        advantage: ``(*batch)`` advantages (treated as constants).
        clip: eps in (0, 1).

    Returns:
        ``(*batch)`` per-sample losses; take their (masked) mean.

    Raises:
        ShapeError: ``logp_old`` or ``advantage`` is not shaped like ``logp``.
        ConfigError: ``clip`` outside (0, 1).

    Examples:
        Ratios 2, 1 and 0.5 with eps 0.2: the first is clipped to 1.2 for ``A = 1`` and the
        last to 0.8 for ``A = -1`` (both already moved past the trust region).

        >>> logp_old = torch.zeros(3)
        >>> logp = torch.log(torch.tensor([2.0, 1.0, 0.5]))
        >>> clipped_surrogate(logp, logp_old, torch.tensor([1.0, 1.0, -1.0]), 0.2)
        tensor([-1.2000, -1.0000,  0.8000])
    """
    check_like("logp_old", logp_old, logp, "logp")
    check_like("advantage", advantage, logp, "logp")
    clip = float(clip)
    if not 0.0 < clip < 1.0:  # also rejects NaN
        raise ConfigError(f"clip must be in (0, 1), got {clip}")
    ratio = (logp - logp_old).exp()
    advantage = advantage.detach()
    return -torch.min(ratio * advantage, ratio.clamp(1.0 - clip, 1.0 + clip) * advantage)

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
TRPO's natural-gradient solve) live in :mod:`rlstruct.blocks.policy_terms` and are re-exported here.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from rlstruct.blocks.policy_terms import (
    categorical_entropy,
    categorical_log_prob,
    conjugate_gradient,
)
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


def _check_like(name: str, x: Tensor, ref: Tensor, ref_name: str = "reward") -> None:
    if tuple(x.shape) != tuple(ref.shape):
        raise ShapeError(
            f"{name} has shape {tuple(x.shape)}, expected {tuple(ref.shape)} like {ref_name}"
        )


def _check_reward(reward: Tensor) -> None:
    if reward.dim() != 2:
        raise ShapeError(f"reward must be 2-D (B, T), got shape {tuple(reward.shape)}")


def _as_flag(name: str, x: Tensor, ref: Tensor) -> Tensor:
    _check_like(name, x, ref)
    return x if x.dtype == torch.bool else x != 0


def _check_unit(name: str, v: float) -> float:
    v = float(v)
    if not 0.0 <= v <= 1.0:  # also rejects NaN
        raise ConfigError(f"{name} must be in [0, 1], got {v}")
    return v


def _check_lengths(lengths: Tensor, batch: int, time: int) -> Tensor:
    if lengths.dim() != 1 or lengths.shape[0] != batch:
        raise ShapeError(f"lengths has shape {tuple(lengths.shape)}, expected ({batch},) (B,)")
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be an integer tensor, got dtype {lengths.dtype}")
    if batch > 0:
        lo, hi = torch.aminmax(lengths)  # one host sync, outside every loop
        if int(lo) < 0 or int(hi) > time:
            raise ShapeError(
                f"lengths must lie in [0, {time}] (T), got min {int(lo)} max {int(hi)}"
            )
    return lengths


def _prepare(
    reward: Tensor, terminated: Tensor, truncated: Tensor, lengths: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Validate and return (terminated, valid, cont) as bool (B, T) tensors."""
    _check_reward(reward)
    batch, time = reward.shape
    term = _as_flag("terminated", terminated, reward)
    done = term | _as_flag("truncated", truncated, reward)
    valid = valid_mask(_check_lengths(lengths, batch, time).to(reward.device), time)
    # t + 1 is valid (so t is not the last valid step) and the episode goes on after t.
    cont = torch.cat([valid[:, 1:], valid.new_zeros(batch, min(time, 1))], dim=1) & ~done
    return term, valid, cont


def _reverse_scan(base: Tensor, coef: Tensor) -> Tensor:
    """out[:, t] = base[:, t] + coef[:, t] * out[:, t + 1] (out[:, T] = 0); loops over T."""
    time = base.shape[1]
    if time == 0:
        return base.clone()
    outs: list[Tensor] = [base[:, 0]] * time
    acc = torch.zeros_like(base[:, 0])
    for t in range(time - 1, -1, -1):
        acc = base[:, t] + coef[:, t] * acc
        outs[t] = acc
    return torch.stack(outs, dim=1)


def valid_mask(lengths: Tensor, T: int) -> Tensor:  # noqa: N803 (T is the documented name)
    """Bool mask of the valid (non-padding) steps.

    Args:
        lengths: (B,) integer number of valid leading steps per row.
        T: time length of the segment.

    Returns:
        (B, T) bool tensor, true where ``t < lengths[b]``, on ``lengths.device``.

    Examples:
        >>> valid_mask(torch.tensor([2, 0, 3]), 3)
        tensor([[ True,  True, False],
                [False, False, False],
                [ True,  True,  True]])
    """
    if lengths.dim() != 1:
        raise ShapeError(f"lengths has shape {tuple(lengths.shape)}, expected (B,)")
    if int(T) < 0:
        raise ConfigError(f"T must be >= 0, got {T}")
    return torch.arange(int(T), device=lengths.device) < lengths.unsqueeze(1)


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
    gamma = _check_unit("gamma", gamma)
    term, valid, cont = _prepare(reward, terminated, truncated, lengths)
    zero = torch.zeros((), dtype=reward.dtype, device=reward.device)
    base = torch.where(valid, reward, zero)
    if next_value is not None:
        _check_like("next_value", next_value, reward)
        base = base + gamma * torch.where(valid & ~term & ~cont, next_value, zero)
    return _reverse_scan(base, gamma * cont.to(base.dtype))


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
    gamma = _check_unit("gamma", gamma)
    _check_reward(reward)
    _check_like("next_value", next_value, reward)
    term = _as_flag("terminated", terminated, reward)
    _as_flag("truncated", truncated, reward)
    zero = torch.zeros((), dtype=reward.dtype, device=reward.device)
    out = reward + gamma * torch.where(term, zero, next_value)
    if lengths is not None:
        batch, time = reward.shape
        valid = valid_mask(_check_lengths(lengths, batch, time).to(reward.device), time)
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
    gamma = _check_unit("gamma", gamma)
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ConfigError(f"n must be an integer >= 1, got {n!r}")
    term, valid, cont = _prepare(reward, terminated, truncated, lengths)
    _check_like("next_value", next_value, reward)
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
    gamma = _check_unit("gamma", gamma)
    lam = _check_unit("lam", lam)
    term, valid, cont = _prepare(reward, terminated, truncated, lengths)
    _check_like("value", value, reward)
    _check_like("next_value", next_value, reward)
    zero = torch.zeros((), dtype=reward.dtype, device=reward.device)
    delta = reward + gamma * torch.where(term, zero, next_value) - value
    delta = torch.where(valid, delta, zero)
    adv = _reverse_scan(delta, (gamma * lam) * cont.to(delta.dtype))
    return adv, torch.where(valid, adv + value, zero)


class VTrace(NamedTuple):
    """What :func:`vtrace` returns: two (B, T) tensors, 0 on padding, without autograd history.

    Attributes:
        targets: (B, T) the V-trace value targets ``v_t``, the regression targets of V(x_t).
        advantages: (B, T) the policy-gradient advantages
            ``rho_t (r_t + gamma (1 - terminated_t) q_t - V(x_t))``.
    """

    targets: Tensor
    advantages: Tensor


def _check_bar(name: str, v: float) -> float:
    v = float(v)
    if not v > 0.0:  # also rejects NaN; inf means no clipping
        raise ConfigError(f"{name} must be > 0 (float('inf') for no clipping), got {v}")
    return v


def vtrace(
    reward: Tensor, value: Tensor, next_value: Tensor, terminated: Tensor, truncated: Tensor,
    lengths: Tensor, log_rho: Tensor, gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0,
) -> VTrace:
    """V-trace off-policy value targets and policy-gradient advantages (Espeholt et al., 2018).

    The data was collected by a behaviour policy mu and is learned on by a target policy pi;
    ``log_rho[:, t] = log pi(a_t | x_t) - log mu(a_t | x_t)``. With the truncated importance
    weights ``rho_t = min(rho_bar, exp(log_rho_t))`` and ``c_t = min(c_bar, exp(log_rho_t))``,
    on every valid step::

        delta_t = rho_t (r_t + gamma (1 - terminated_t) V'_t - V_t)
        v_t - V_t = delta_t + gamma c_t [t continues] (v_{t+1} - V_{t+1})
        A_t = rho_t (r_t + gamma (1 - terminated_t) q_t - V_t)
        q_t = v_{t+1} if [t continues] else V'_t

    where ``V_t = value[:, t]``, ``V'_t = next_value[:, t]`` (the value of the TRUE next
    observation, as in :func:`gae`) and ``[t continues]`` means that ``t`` is neither done
    (terminated or truncated) nor the last valid step of its row. So the correction recursion
    stops at every episode end and at the row's end; a terminated step bootstraps from 0, a
    truncated step or a segment cut from ``next_value`` (``v`` of the next state is taken as
    ``V'_t``, uncorrected, as in the paper's bootstrap value). The recursion adds
    ``v_{t+1} - value[:, t + 1]``, so inside an episode ``next_value[:, t]`` should equal
    ``value[:, t + 1]`` (what a rollout gives); both are taken as given, like :func:`gae` does.

    On-policy (``log_rho = 0``) with ``rho_bar >= 1`` and ``c_bar >= 1`` this is
    ``gae(..., lam=1)``: ``targets`` are exactly its returns, and ``advantages`` its advantages
    wherever ``next_value[:, t] == value[:, t + 1]`` inside episodes (the advantages read
    ``v_{t+1}``, built on ``value[:, t + 1]``, where GAE reads ``next_value[:, t]``).

    The targets are constants for the learner: the inputs are detached, so the outputs carry no
    autograd history whether or not the call runs under ``torch.no_grad()``. Loops over T,
    vectorised over B; results on ``reward``'s device, in the promoted floating dtype of
    ``reward``, ``value``, ``next_value`` and ``log_rho``.

    Args:
        reward: (B, T) rewards.
        value: (B, T) V(x_t) under the learner's current value function.
        next_value: (B, T) V(x'_t), the value of the true next observation.
        terminated: (B, T) termination flags (no bootstrap).
        truncated: (B, T) truncation flags (bootstrap from ``next_value``, recursion cut).
        lengths: (B,) integer valid lengths, in [0, T].
        log_rho: (B, T) log importance ratios ``log pi(a_t|x_t) - log mu(a_t|x_t)``.
        gamma: discount in [0, 1].
        rho_bar: clipping threshold of ``rho`` (in ``delta_t`` and the advantages), > 0.
        c_bar: clipping threshold of the trace coefficients ``c``, > 0.

    Returns:
        :class:`VTrace` ``(targets, advantages)``, each (B, T), 0 on padding (whatever the
        padding holds, NaN included).

    Raises:
        ShapeError: an argument's shape differs from ``reward``'s (the message names it), or
            ``lengths`` is not (B,) within [0, T].
        ConfigError: ``gamma`` outside [0, 1], or ``rho_bar`` / ``c_bar`` not > 0.

    Examples:
        One row, no episode end, cut at t=2; gamma 0.5, V = V' = 0.5; rho = c = (1, 0.5, 1)
        after clipping: delta = (0.75, 0.375, 0.75), v_2 = 0.5 + 0.75,
        v_1 = 0.5 + 0.375 + 0.5 * 0.5 * 0.75, v_0 = 0.5 + 0.75 + 0.5 * 1 * 0.5625.

        >>> r, v = torch.ones(1, 3), torch.full((1, 3), 0.5)
        >>> f = torch.zeros(1, 3, dtype=torch.bool)
        >>> log_rho = torch.log(torch.tensor([[2.0, 0.5, 1.0]]))
        >>> out = vtrace(r, v, v, f, f, torch.tensor([3]), log_rho, 0.5)
        >>> out.targets
        tensor([[1.5312, 1.0625, 1.2500]])
        >>> out.advantages
        tensor([[1.0312, 0.5625, 0.7500]])
    """
    gamma = _check_unit("gamma", gamma)
    rho_bar, c_bar = _check_bar("rho_bar", rho_bar), _check_bar("c_bar", c_bar)
    term, valid, cont = _prepare(reward, terminated, truncated, lengths)
    r, v, nv, lr = _detached_floats(reward, value=value, next_value=next_value, log_rho=log_rho)
    return _vtrace_scan(r, v, nv, lr, term, valid, cont, gamma, rho_bar, c_bar)


def _detached_floats(reward: Tensor, **others: Tensor) -> tuple[Tensor, ...]:
    """``reward`` and ``others`` (each checked to be shaped like it), detached and cast to
    their promoted floating dtype (the default float dtype if none is floating)."""
    for name, x in others.items():
        _check_like(name, x, reward)
    dtype = reward.dtype
    for x in others.values():
        dtype = torch.promote_types(dtype, x.dtype)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    return tuple(x.detach().to(dtype) for x in (reward, *others.values()))


def _vtrace_scan(
    r: Tensor, v: Tensor, nv: Tensor, lr: Tensor, term: Tensor, valid: Tensor, cont: Tensor,
    gamma: float, rho_bar: float, c_bar: float,
) -> VTrace:
    """The V-trace recursion of :func:`vtrace` on checked (B, T) floats: rewards, values, next
    values and log ratios, with the termination, valid and continuation masks of
    :func:`_prepare`."""
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    ratio = torch.exp(lr)  # garbage in padding is masked below, never multiplied into a result
    rho = torch.where(valid, ratio.clamp(max=rho_bar), zero)
    boot = torch.where(term, zero, nv)
    delta = torch.where(valid, rho * (r + gamma * boot - v), zero)
    coef = torch.where(cont, gamma * ratio.clamp(max=c_bar), zero)
    targets = torch.where(valid, _reverse_scan(delta, coef) + v, zero)
    batch, time = r.shape
    v_next = torch.cat([targets[:, 1:], targets.new_zeros(batch, min(time, 1))], dim=1)
    q = torch.where(cont, v_next, boot)
    advantages = torch.where(valid, rho * (r + gamma * q - v), zero)
    return VTrace(targets, advantages)


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
    _check_like("logp_old", logp_old, logp, "logp")
    _check_like("advantage", advantage, logp, "logp")
    clip = float(clip)
    if not 0.0 < clip < 1.0:  # also rejects NaN
        raise ConfigError(f"clip must be in (0, 1), got {clip}")
    ratio = (logp - logp_old).exp()
    advantage = advantage.detach()
    return -torch.min(ratio * advantage, ratio.clamp(1.0 - clip, 1.0 + clip) * advantage)

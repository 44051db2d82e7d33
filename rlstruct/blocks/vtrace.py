"""V-trace (Espeholt et al., 2018): off-policy value targets and policy-gradient advantages over
(B, T) segments, with the conventions of :mod:`rlstruct.blocks.functional` (which re-exports
:func:`vtrace` and :class:`VTrace`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from rlstruct.blocks.segments import check_like, check_unit, reverse_scan, segment_masks
from rlstruct.errors import ConfigError

__all__ = ["VTrace", "vtrace"]


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
    gamma = check_unit("gamma", gamma)
    rho_bar, c_bar = _check_bar("rho_bar", rho_bar), _check_bar("c_bar", c_bar)
    term, valid, cont = segment_masks(reward, terminated, truncated, lengths)
    r, v, nv, lr = _detached_floats(reward, value=value, next_value=next_value, log_rho=log_rho)
    return _vtrace_scan(r, v, nv, lr, term, valid, cont, gamma, rho_bar, c_bar)


def _detached_floats(reward: Tensor, **others: Tensor) -> tuple[Tensor, ...]:
    """``reward`` and ``others`` (each checked to be shaped like it), detached and cast to
    their promoted floating dtype (the default float dtype if none is floating)."""
    for name, x in others.items():
        check_like(name, x, reward)
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
    ``segment_masks``."""
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    ratio = torch.exp(lr)  # garbage in padding is masked below, never multiplied into a result
    rho = torch.where(valid, ratio.clamp(max=rho_bar), zero)
    boot = torch.where(term, zero, nv)
    delta = torch.where(valid, rho * (r + gamma * boot - v), zero)
    coef = torch.where(cont, gamma * ratio.clamp(max=c_bar), zero)
    targets = torch.where(valid, reverse_scan(delta, coef) + v, zero)
    batch, time = r.shape
    v_next = torch.cat([targets[:, 1:], targets.new_zeros(batch, min(time, 1))], dim=1)
    q = torch.where(cont, v_next, boot)
    advantages = torch.where(valid, rho * (r + gamma * q - v), zero)
    return VTrace(targets, advantages)

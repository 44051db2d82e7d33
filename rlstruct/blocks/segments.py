"""(B, T) trajectory segments: the valid-step mask, and the argument checks and the reverse scan
that the estimators of :mod:`rlstruct.blocks.functional` and :mod:`rlstruct.blocks.vtrace` share
(conventions in :mod:`rlstruct.blocks.functional`). ``valid_mask`` is re-exported there.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlstruct.errors import ConfigError, ShapeError

__all__ = ["valid_mask"]


def check_like(name: str, x: Tensor, ref: Tensor, ref_name: str = "reward") -> None:
    """Raises :class:`~rlstruct.errors.ShapeError` (naming ``name`` and ``ref_name``) unless
    ``x`` is shaped like ``ref``."""
    if tuple(x.shape) != tuple(ref.shape):
        raise ShapeError(
            f"{name} has shape {tuple(x.shape)}, expected {tuple(ref.shape)} like {ref_name}"
        )


def check_reward(reward: Tensor) -> None:
    """Raises :class:`~rlstruct.errors.ShapeError` unless ``reward`` is 2-D ``(B, T)``."""
    if reward.dim() != 2:
        raise ShapeError(f"reward must be 2-D (B, T), got shape {tuple(reward.shape)}")


def as_flag(name: str, x: Tensor, ref: Tensor) -> Tensor:
    """``x`` (shaped like ``ref``, checked) as a bool tensor: nonzero counts as true."""
    check_like(name, x, ref)
    return x if x.dtype == torch.bool else x != 0


def check_unit(name: str, v: float) -> float:
    """``v`` as a float, checked to lie in [0, 1] (a :class:`~rlstruct.errors.ConfigError`
    naming ``name`` otherwise, NaN included)."""
    v = float(v)
    if not 0.0 <= v <= 1.0:  # also rejects NaN
        raise ConfigError(f"{name} must be in [0, 1], got {v}")
    return v


def check_lengths(lengths: Tensor, batch: int, time: int) -> Tensor:
    """``lengths``, checked to be a ``(batch,)`` integer tensor within [0, time] (one host
    sync).

    Raises:
        ShapeError: another shape, or a length outside [0, time].
        TypeError: a floating, complex or bool dtype.
    """
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


def segment_masks(
    reward: Tensor, terminated: Tensor, truncated: Tensor, lengths: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Validate the flags and lengths of a segment and return ``(terminated, valid, cont)`` as
    bool (B, T) tensors: ``cont[:, t]`` is true where ``t + 1`` is valid and the episode goes
    on after ``t``.

    Raises:
        ShapeError: ``reward`` is not 2-D, a flag is not shaped like it, or ``lengths`` is not
            (B,) within [0, T].
    """
    check_reward(reward)
    batch, time = reward.shape
    term = as_flag("terminated", terminated, reward)
    done = term | as_flag("truncated", truncated, reward)
    valid = valid_mask(check_lengths(lengths, batch, time).to(reward.device), time)
    # t + 1 is valid (so t is not the last valid step) and the episode goes on after t.
    cont = torch.cat([valid[:, 1:], valid.new_zeros(batch, min(time, 1))], dim=1) & ~done
    return term, valid, cont


def reverse_scan(base: Tensor, coef: Tensor) -> Tensor:
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

"""The optimizer every algorithm builds and the gradient step it takes, with one meaning of
gradient clipping.

Example:
    >>> import torch
    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> optimizer = torch.optim.SGD([w], lr=1.0)
    >>> norm = gradient_step(optimizer, (10 * w).sum(), max_grad_norm=1.0)
    >>> round(float(norm), 3), [round(x, 3) for x in w.tolist()]  # the step is clipped to norm 1
    (14.142, [0.293, 0.293])
    >>> gradient_step(optimizer, (10 * w).sum(), max_grad_norm=0) is None  # 0: no clipping
    True
    >>> adam([w], lr=1e-3, device=torch.device("cpu")).defaults["fused"]  # one kernel
    True

Every algorithm builds :func:`adam` (``torch.optim.Adam``, fused where the device allows it)
and steps it with :func:`gradient_step`. A hand-written Adam over one flat buffer was measured
against it on the real workloads (``benchmarks/optimizers.py`` of commit e9b5192) and
removed: slower on PPO's Nature CNN, and its gain on MLPs did not pay for the build-order
coupling it brought.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from rlstruct.devices import resolve_device
from rlstruct.dicttensor import DeviceLike

__all__ = ["adam", "Optimizer", "gradient_step"]

_FUSED_DEVICE_TYPES = ("cpu", "cuda")


def adam(
    params: Iterable[Tensor] | Iterable[dict],
    lr: float,
    device: DeviceLike,
    eps: float = 1e-8,
) -> torch.optim.Adam:
    """``torch.optim.Adam`` over ``params``, fused where the device allows it.

    The fused implementation updates every parameter in one kernel instead of a few per
    parameter: cheaper for the small nets of RL, on the CPU as on CUDA. Other devices (``mps``,
    ``meta``...) get the default implementation.

    Args:
        params: the parameters (or parameter groups), all on ``device``.
        lr: the learning rate.
        device: where the parameters live (e.g. ``run.device``).
        eps: Adam's epsilon (``1e-5`` is the usual choice for PPO-like losses).

    Returns:
        The optimizer.
    """
    fused = resolve_device(device).type in _FUSED_DEVICE_TYPES
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=fused)


def gradient_step(
    optimizer: Optimizer, loss: Tensor, max_grad_norm: float,
    around_backward: tuple[Callable[[], None], Callable[[], None]] | None = None,
) -> Tensor | None:
    """``zero_grad``, ``backward``, clip the global gradient norm, ``step``.

    Args:
        optimizer: a ``torch.optim`` optimizer (its parameter groups are the parameters clipped
            together).
        loss: a scalar with a graph to the parameters.
        max_grad_norm: clip the global norm of all the gradients to this; 0 means no clipping.
        around_backward: ``(before, after)`` called just before and after ``backward`` (a
            data-parallel learner rank arms its gradient all-reduce, then waits for it).

    Returns:
        The global gradient norm before clipping (a 0-d tensor; no host sync), or ``None``
        when ``max_grad_norm`` is 0.
    """
    optimizer.zero_grad(set_to_none=True)
    if around_backward is not None:
        around_backward[0]()
    loss.backward()
    if around_backward is not None:
        around_backward[1]()
    norm = None
    if max_grad_norm > 0:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        norm = nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return norm


#: What :func:`gradient_step` and the learner groups take.
Optimizer = torch.optim.Optimizer

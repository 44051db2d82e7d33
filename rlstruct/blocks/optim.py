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
or, for A2C's rl-zoo settings, :func:`rmsprop_tf` (:class:`RMSpropTF`, RMSprop as TensorFlow
and SB3's ``RMSpropTFLike`` take it), and steps it with :func:`gradient_step`. A hand-written
Adam over one flat buffer was measured against it on the real workloads
(``benchmarks/optimizers.py`` of commit e9b5192) and removed: slower on PPO's Nature CNN, and
its gain on MLPs did not pay for the build-order coupling it brought.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from typing import TypeVar

import torch
from torch import Tensor, nn

from rlstruct.devices import resolve_device
from rlstruct.dicttensor import DeviceLike

__all__ = ["adam", "Optimizer", "RMSpropTF", "concurrent_step", "gradient_step", "polyak",
           "rmsprop_tf"]

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


class RMSpropTF(torch.optim.Optimizer):
    """RMSprop as TensorFlow defines it (what SB2's and rl-zoo's A2C Atari results used).

    For each parameter ``p`` with gradient ``g``: ``v <- alpha v + (1 - alpha) g^2`` and
    ``p <- p - lr g / sqrt(v + eps)``. Two differences from ``torch.optim.RMSprop``: ``eps`` is
    inside the square root (torch adds it after: ``sqrt(v) + eps``), and ``v`` starts at ONES
    (torch: zeros), so the first steps are about ``lr g``, not ``lr g / |g| sqrt(1 - alpha)``
    (ten times larger with ``alpha = 0.99``). No momentum, no centring, no weight decay.

    Args:
        params: the parameters (or parameter groups).
        lr: the learning rate.
        alpha: the square average's smoothing constant.
        eps: added to the square average inside the square root.

    Example:
        >>> w = torch.nn.Parameter(torch.tensor([1.0]))
        >>> opt = RMSpropTF([w], lr=0.1, alpha=0.9, eps=0.0)
        >>> w.grad = torch.tensor([2.0])
        >>> opt.step()  # v = 0.9 * 1 + 0.1 * 4 = 1.3; w = 1 - 0.1 * 2 / sqrt(1.3)
        >>> round(w.item(), 5), round(opt.state[w]["square_avg"].item(), 5)
        (0.82459, 1.3)
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float,
                 alpha: float = 0.99, eps: float = 1e-5) -> None:
        if lr < 0 or eps < 0 or not 0 <= alpha < 1:
            raise ValueError(f"need lr >= 0, eps >= 0 and 0 <= alpha < 1; got {lr}, {eps}, "
                             f"{alpha}")
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One update of every parameter that has a gradient; returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
                square_avg = state["square_avg"]
                square_avg.mul_(alpha).addcmul_(p.grad, p.grad, value=1 - alpha)
                p.addcdiv_(p.grad, square_avg.add(eps).sqrt_(), value=-lr)
        return loss


def rmsprop_tf(
    params: Iterable[Tensor] | Iterable[dict], lr: float, device: DeviceLike | None = None,
    alpha: float = 0.99, eps: float = 1e-5,
) -> RMSpropTF:
    """:class:`RMSpropTF` over ``params``, with :func:`adam`'s signature (``device`` is unused:
    the update runs where the parameters are), so a learner group builds either.

    Args:
        params: the parameters (or parameter groups).
        lr: the learning rate.
        device: where the parameters live (unused).
        alpha: the square average's smoothing constant (SB3's A2C: 0.99).
        eps: inside the square root (rl-zoo's A2C Atari: 1e-5).

    Returns:
        The optimizer.
    """
    del device
    return RMSpropTF(params, lr, alpha, eps)


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


S = TypeVar("S")


def concurrent_step(
    optimizer: Optimizer, losses: Sequence[Callable[[], tuple[Tensor, S]]], pool: Executor,
    max_grad_norm: float, timeout: float = 600.0,
) -> list[S]:
    """:func:`gradient_step` over a sum of losses of DISJOINT parameters, each built and
    back-propagated at once in its own thread: ``losses[0]`` in the calling thread, the others
    on ``pool``'s threads, under the caller's autocast. The gradients, and so the step, are those
    of one backward through the sum; the losses' kernels run side by side instead of one after
    the other (SAC's critic loss and its policy loss: docs/algorithms.md, SAC).

    Args:
        optimizer: the optimizer of all the parameters.
        losses: functions building ``(loss, extra)``; no parameter may get a gradient from two
            of them (their backward passes would write its ``.grad`` at once).
        pool: at least ``len(losses) - 1`` threads.
        max_grad_norm: as :func:`gradient_step`'s (0: no clipping).
        timeout: the seconds a pool thread's loss may take.

    Returns:
        The losses' ``extra`` values, in order.

    Raises:
        concurrent.futures.TimeoutError: a pool thread's loss took longer than ``timeout``.
    """
    device = next(p for g in optimizer.param_groups for p in g["params"]).device.type
    modes = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
    optimizer.zero_grad(set_to_none=True)
    futures = [pool.submit(_backward, fn, device, modes) for fn in losses[1:]]
    extras: list[S] = []
    try:
        extras.append(_backward(losses[0], device, modes))
    finally:  # also when losses[0] failed: no backward pass is left running behind the caller
        rest = [f.result(timeout) for f in futures]
    extras += rest
    if max_grad_norm > 0:
        nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]],
                                 max_grad_norm)
    optimizer.step()
    return extras


def _backward(loss_fn: Callable[[], tuple[Tensor, S]], device: str,
              modes: tuple[bool, torch.dtype]) -> S:
    """``loss_fn()``'s loss back-propagated in this thread, under autocast ``modes``."""
    with torch.autocast(device, dtype=modes[1], enabled=modes[0]):
        loss, extra = loss_fn()
    loss.backward()
    return extra


#: What :func:`gradient_step` and the learner groups take.
Optimizer = torch.optim.Optimizer


@torch.no_grad()
def polyak(target: list[Tensor], online: list[Tensor], tau: float) -> None:
    """``target <- tau online + (1 - tau) target`` (Polyak averaging), in one foreach kernel.

    Args:
        target: the target network's tensors, updated in place.
        online: the online network's tensors, in the same order and shapes.
        tau: the rate, in ``(0, 1]`` (1 copies the online tensors).
    """
    torch._foreach_lerp_(target, online, tau)

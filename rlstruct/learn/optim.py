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

A small net's step is mostly per-tensor overhead (zero the gradients, clip them, update them:
each a few operations per parameter tensor). :class:`FlatAdam` keeps the parameters and their
gradients in one flat buffer each, so these are a few operations in all:

    >>> net = torch.nn.Linear(3, 2)
    >>> optimizer = flat_adam(net.parameters(), lr=1e-3, device="cpu")
    >>> optimizer.flat.shape, net.weight.shape  # the net's parameters are views of it
    (torch.Size([8]), torch.Size([2, 3]))
    >>> norm = gradient_step(optimizer, net(torch.ones(1, 3)).sum(), max_grad_norm=0.5)
    >>> round(float(norm), 3), round(float(optimizer.flat_grad().norm()), 3)  # clipped
    (2.828, 0.5)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from rlstruct.devices import resolve_device
from rlstruct.dicttensor import DeviceLike
from rlstruct.errors import ConfigError, LearnerError

__all__ = ["adam", "flat_adam", "FlatAdam", "Optimizer", "gradient_step"]

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
            together) or a :class:`FlatAdam` (its flat gradient is clipped).
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
    if max_grad_norm > 0 and isinstance(optimizer, FlatAdam):
        norm = optimizer.clip_grad_norm_(max_grad_norm)
    elif max_grad_norm > 0:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        norm = nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return norm


def flat_adam(
    params: Iterable[Tensor], lr: float, device: DeviceLike, eps: float = 1e-8
) -> FlatAdam:
    """A :class:`FlatAdam` over ``params``: Adam with the parameters and gradients in one flat
    buffer each.

    Args:
        params: the parameters (tensors, not groups), all on ``device``, one dtype.
        lr: the learning rate.
        device: where the parameters live (e.g. ``run.device``).
        eps: Adam's epsilon.

    Returns:
        The optimizer; its ``flat`` buffer holds the values of all of ``params``.

    Raises:
        ConfigError: ``params`` are not all on ``device`` (or see :class:`FlatAdam`).
    """
    tensors = list(params)
    where = resolve_device(device)
    wrong = sorted({str(t.device) for t in tensors if isinstance(t, Tensor)
                    and resolve_device(t.device) != where})
    if wrong:
        raise ConfigError(f"flat_adam: the parameters are on {wrong}, not on {where}")
    return FlatAdam(tensors, lr=lr, eps=eps)


class FlatAdam:
    """Adam (Kingma and Ba, 2015; ``torch.optim.Adam``'s update, without weight decay) over
    parameters that live in ONE flat buffer, their gradients in another.

    On construction each parameter's values move into a slice of one buffer (``flat``) and the
    parameter becomes a view of its slice; its ``.grad`` becomes a view of the same slice of one
    gradient buffer, into which ``backward`` accumulates in place. Zeroing, clipping
    (:func:`gradient_step`) and the update are then a few operations for the whole net rather
    than a few per parameter tensor, which is most of a small net's step: for the 64-wide
    actor-critic MLPs of the CartPole examples, about 15 % of APPO's gradient step on the CPU
    (docs/algorithms.md, "Where APPO's time goes").

    It is not a ``torch.optim.Optimizer``: building the first of those in a process imports
    ``torch._dynamo`` (about a second on one core), which every algorithm paid before its first
    segment. It has what the algorithms and checkpoints use: ``param_groups[0]["lr"]`` (set it
    to anneal), :meth:`zero_grad`, :meth:`step`, :meth:`state_dict` and
    :meth:`load_state_dict`. The update is ``torch.optim.Adam``'s (``foreach=False``), operation
    for operation.

    The module keeps its parameters: ``state_dict``, ``load_state_dict`` (an in-place copy) and
    the forward pass see the flat buffer's values. Gradients that bypass the buffer (a
    ``model.zero_grad()`` sets them to None, and the next ``backward`` makes new ones) are copied
    back into it before clipping and stepping, so any way of zeroing works. Giving a parameter
    new storage (``param.data = ...``, ``model.to(other_device)``) would unlink it from the
    optimizer: :meth:`step` raises a :class:`~rlstruct.errors.LearnerError` naming it. Tensors
    taken from the parameters before the optimizer was built (the values of an earlier
    ``state_dict()``, ``p.data``) keep the old storage and no longer follow the weights: take
    them after building it, or copy them.

    Args:
        params: the parameters (tensors, not groups): leaf tensors that require gradients, on
            one device, of one floating dtype, each given once.
        lr: the learning rate.
        betas: the decay rates of the first and second moment estimates.
        eps: Adam's epsilon.

    Raises:
        ConfigError: no parameter, a parameter given twice, or parameters on several devices or
            of several dtypes.
    """

    def __init__(self, params: Iterable[Tensor], lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        tensors = list(params)
        _check_flattenable(tensors)
        sizes = [p.numel() for p in tensors]
        #: Every value of ``params``, in their order: the parameters are views of it.
        self.flat = torch.empty(sum(sizes), device=tensors[0].device, dtype=tensors[0].dtype)
        self._grad = torch.zeros_like(self.flat)
        self._params = tensors
        self._value_ptrs = [v.data_ptr() for v in self.flat.split(sizes)]
        self._grad_views = [g.view_as(p) for g, p in zip(self._grad.split(sizes), tensors)]
        with torch.no_grad():
            for p, view in zip(tensors, self.flat.split(sizes)):
                view.copy_(p.reshape(-1))
                p.data = view.view_as(p)
        #: As in ``torch.optim``: one group; algorithms anneal ``param_groups[0]["lr"]``.
        self.param_groups: list[dict[str, Any]] = [
            {"lr": lr, "betas": betas, "eps": eps, "params": tensors}]
        self._step = 0
        self._exp_avg = torch.zeros_like(self.flat)
        self._exp_avg_sq = torch.zeros_like(self.flat)
        self._link()

    def _link(self) -> None:
        """Points each parameter's ``.grad`` at its slice of the buffer again, copying in a
        gradient that was accumulated elsewhere (zero if it was set to None)."""
        for p, view in zip(self._params, self._grad_views):
            g = p.grad
            if g is not view:
                if g is None:
                    view.zero_()
                else:
                    view.copy_(g)
                p.grad = view

    def flat_grad(self) -> Tensor:
        """The gradients of all the parameters, as one tensor ``(n,)`` (a view: scaling it
        scales them)."""
        self._link()
        return self._grad

    def clip_grad_norm_(self, max_norm: float) -> Tensor:
        """Scales the gradients so that their global norm is at most ``max_norm``
        (``torch.nn.utils.clip_grad_norm_``'s formula, on the one flat gradient).

        Returns:
            The global norm before clipping (a 0-d tensor; no host sync).
        """
        grad = self.flat_grad()
        norm = torch.linalg.vector_norm(grad)
        grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the gradient buffer in place (``set_to_none`` is ignored: the parameters'
        gradients are views of the buffer and stay so)."""
        self._link()
        self._grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One Adam update of every parameter.

        Raises:
            LearnerError: a parameter no longer lives in the flat buffer (new storage was given
                to it after the optimizer was built).
        """
        for i, (p, ptr) in enumerate(zip(self._params, self._value_ptrs)):
            if p.data_ptr() != ptr:
                raise LearnerError(
                    f"FlatAdam: parameter {i} (shape {tuple(p.shape)}) no longer lives in the "
                    "optimizer's flat buffer: it was given new storage (param.data = ..., "
                    "module.to(...)) after the optimizer was built; build the optimizer after "
                    "moving the model")
        self._link()
        group = self.param_groups[0]
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        self._step += 1
        self._exp_avg.lerp_(self._grad, 1 - beta1)
        self._exp_avg_sq.mul_(beta2).addcmul_(self._grad, self._grad, value=1 - beta2)
        step_size = lr / (1 - beta1**self._step)
        denom = (self._exp_avg_sq.sqrt() / math.sqrt(1 - beta2**self._step)).add_(eps)
        self.flat.addcdiv_(self._exp_avg, denom, value=-step_size)

    def state_dict(self) -> dict[str, Any]:
        """``torch.optim``'s layout for one parameter (the flat buffer): ``{"state": {0:
        {"step", "exp_avg", "exp_avg_sq"}}, "param_groups": [{"lr", "betas", "eps", "params":
        [0]}]}`` (the moments are not copied)."""
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return {"state": {0: {"step": torch.tensor(float(self._step)), "exp_avg": self._exp_avg,
                              "exp_avg_sq": self._exp_avg_sq}},
                "param_groups": [{**group, "params": [0]}]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a :meth:`state_dict` (the moments are copied), or the ``state_dict`` of a
        ``torch.optim.Adam`` over the same parameters in the same order (its per-parameter
        moments are flattened: checkpoints written before an algorithm used FlatAdam resume).

        Raises:
            ValueError: the state is neither, or its sizes differ from this optimizer's.
        """
        try:
            states = [state_dict["state"][i] for i in sorted(state_dict["state"])]
            group = dict(state_dict["param_groups"][0])
        except (KeyError, IndexError, TypeError) as err:
            raise ValueError(f"not an Adam state ({err!r} missing)") from err
        if len(states) == 1 and states[0]["exp_avg"].shape == self.flat.shape:
            moments = [states[0]["exp_avg"]], [states[0]["exp_avg_sq"]]
        elif [tuple(s["exp_avg"].shape) for s in states] == [tuple(p.shape) for p in
                                                               self._params]:
            moments = ([s["exp_avg"].reshape(-1) for s in states],
                       [s["exp_avg_sq"].reshape(-1) for s in states])
        else:
            raise ValueError(
                f"an Adam state for {[tuple(s['exp_avg'].shape) for s in states]} does not fit "
                f"FlatAdam over {[tuple(p.shape) for p in self._params]} "
                f"({self.flat.numel()} values)")
        self._exp_avg.copy_(torch.cat(moments[0]))
        self._exp_avg_sq.copy_(torch.cat(moments[1]))
        self._step = int(states[0]["step"]) if states else 0
        self.param_groups[0].update({k: group[k] for k in ("lr", "betas", "eps") if k in group})


#: What :func:`gradient_step` and the learner groups take: a ``torch.optim`` optimizer or a
#: :class:`FlatAdam`.
Optimizer = torch.optim.Optimizer | FlatAdam


def _check_flattenable(tensors: list[Tensor]) -> None:
    """Raises a :class:`ConfigError` listing why ``tensors`` cannot share one flat buffer."""
    problems = []
    if not tensors:
        problems.append("no parameter")
    if any(isinstance(t, dict) for t in tensors):
        problems.append("parameter groups are not supported: give the tensors")
        tensors = []
    if len({id(t) for t in tensors}) != len(tensors):
        problems.append("a parameter is given twice")
    for i, t in enumerate(tensors):
        if not (t.is_leaf and t.requires_grad and t.is_floating_point()):
            problems.append(f"parameter {i} (shape {tuple(t.shape)}) is not a floating-point "
                            "leaf tensor that requires gradients")
    if len({(t.device, t.dtype) for t in tensors}) > 1:
        found = sorted({f"{t.device}/{t.dtype}" for t in tensors})
        problems.append(f"parameters on several devices or dtypes: {found}")
    if problems:
        raise ConfigError("FlatAdam: " + "; ".join(problems))

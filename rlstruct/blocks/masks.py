"""Action masks in the agents: the legal actions an env gives (the observation key
``action_mask``, bool ``(n, A)``, True where legal; :mod:`rlstruct.envs.masks`) restrict a
categorical policy and a Q-network's choices.

A masked categorical policy is ``softmax`` of the logits with every illegal action's logit
replaced by :func:`masked_logit` (half the most negative number of the dtype): its
probability is exactly 0, so it is never sampled nor picked by ``argmax``, and the
log-probabilities and entropy of the masked logits are those of the renormalised distribution
over the legal actions. The value is finite, unlike ``-inf``: ``0 * log 0`` terms come out as 0
(no NaN in the entropy or a KL), and no gradient reaches an illegal logit.

The agents mask where the logits are made, acting (the observation's ``action_mask``) and
replaying (the stored ``observation/action_mask``), so every loss that rebuilds the
distribution from replayed logits sees the masked one, and the stored and replayed
log-probabilities agree.

Example:
    >>> logits = torch.tensor([[3.0, 1.0, 1.0]])
    >>> masked = mask_logits(logits, torch.tensor([[False, True, True]]))
    >>> masked.softmax(-1).tolist(), int(masked.argmax(-1))
    ([[0.0, 0.5, 0.5]], 1)
    >>> legal_uniform(torch.tensor([[False, False, True]]), torch.Generator()).tolist()
    [2]
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.blocks.distributions import ActionHead, CategoricalHead
from rlstruct.dicttensor import DictTensor
from rlstruct.errors import SpaceError
from rlstruct.trajectories import Trajectories

__all__ = ["masked_logit", "mask_logits", "observation_mask", "stored_mask", "mask_head_params",
           "legal_uniform", "mask_keys", "next_mask", "epsilon_greedy", "with_next_mask"]


def masked_logit(dtype: torch.dtype) -> float:
    """The logit of an illegal action for logits of ``dtype``: half its most negative value
    (finite, and ``x - logsumexp`` cannot overflow it to ``-inf``)."""
    return torch.finfo(dtype).min / 2


def mask_logits(logits: Tensor, mask: Tensor | None) -> Tensor:
    """``logits`` ``(*B, A)`` with the illegal actions' logits set to :func:`masked_logit`.

    Args:
        logits: the policy's logits or a Q-network's values, ``(*B, A)``.
        mask: ``(*B, A)`` bool (or 0/1) legal actions, on any device; ``None``: all legal.

    Returns:
        A new tensor (``logits`` itself when ``mask`` is None); gradients flow to the legal
        logits only.
    """
    if mask is None:
        return logits
    legal = mask.to(device=logits.device, dtype=torch.bool)
    return logits.masked_fill(~legal, masked_logit(logits.dtype))


def observation_mask(observation: DictTensor) -> Tensor | None:
    """The ``action_mask`` of an observation DictTensor ``(n, ...)``, or ``None``."""
    return observation[K.ACTION_MASK] if K.ACTION_MASK in observation else None  # noqa: SIM401


def stored_mask(steps: DictTensor, t: int | None = None) -> Tensor | None:
    """The stored ``observation/action_mask`` of trajectories ``(B, T, A)`` (of step ``t``,
    ``(B, A)``) or of transitions ``(N, A)``; ``None`` when the env gave none."""
    if K.OBS_ACTION_MASK not in steps:
        return None
    mask = steps[K.OBS_ACTION_MASK]
    return mask if t is None else mask[:, t]


def next_mask(steps: DictTensor) -> Tensor | None:
    """The stored ``_observation/action_mask`` (the next observations' legal actions) of
    transitions ``(N, A)`` or trajectories ``(B, T, A)``; ``None`` when absent."""
    return steps[K.NEXT_ACTION_MASK] if K.NEXT_ACTION_MASK in steps else None  # noqa: SIM401


def mask_head_params(head: ActionHead, params: Tensor, mask: Tensor | None) -> Tensor:
    """A policy head's params with the mask applied: the logits of a
    :class:`~rlstruct.blocks.distributions.CategoricalHead` (:func:`mask_logits`).

    Raises:
        SpaceError: a mask for another head (a Box action space has no action mask).
    """
    if mask is None:
        return params
    if not isinstance(head, CategoricalHead):
        raise SpaceError(f"the observation holds an action_mask, but the policy head is a "
                         f"{type(head).__name__}: action masks restrict Discrete action spaces")
    return mask_logits(params, mask)


def legal_uniform(mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """One legal action per row, uniformly: int64 ``(n,)`` on ``mask``'s device.

    Args:
        mask: ``(n, A)`` bool (or 0/1), at least one legal action per row.
        generator: the random stream (on ``mask``'s device); ``None``: torch's global RNG.
    """
    return torch.multinomial(mask.float(), 1, generator=generator).squeeze(1)


def mask_keys(steps: DictTensor | Trajectories) -> list[str]:
    """``["observation/action_mask"]`` when the trajectories or transitions hold the masks,
    else ``[]`` (the keys a learner keeps for its replay beside ``observation/frame``)."""
    if isinstance(steps, Trajectories):
        steps = steps.trajectories
    return [K.OBS_ACTION_MASK] if K.OBS_ACTION_MASK in steps else []


def epsilon_greedy(q: Tensor, mask: Tensor | None, epsilon: Tensor | None,
                   generator: torch.Generator | None) -> Tensor:
    """DQN's epsilon-greedy choice among the legal actions: int64 ``(n,)`` on ``q``'s device.

    Each row plays the argmax of its legal ``q``, or, with probability ``epsilon``, a uniform
    legal action. One uniform draw and one random action per row and call, explored or not
    (a stable random stream).

    Args:
        q: ``(n, A)`` action values.
        mask: ``(n, A)`` legal actions (any device), or ``None``: all legal.
        epsilon: ``(n,)`` or ``(1,)`` exploration probabilities (any device), or ``None``:
            greedy.
        generator: the random stream, on ``q``'s device.
    """
    action = mask_logits(q, mask).argmax(-1)
    if epsilon is None:
        return action
    n, n_actions = q.shape
    explore = torch.rand(n, generator=generator, device=q.device) < epsilon.to(q.device)
    if mask is None:
        random = torch.randint(n_actions, (n,), generator=generator, device=q.device)
    else:
        random = legal_uniform(mask.to(q.device), generator)
    return torch.where(explore, random, action)


def with_next_mask(traj: Trajectories, n_actions: int) -> Trajectories:
    """``traj`` with ``_observation/action_mask`` (the next observation's legal actions, what a
    Q-learning target maximises over): all legal ``(B, T, A)`` where the env gives no mask.
    A replay buffer then stores the same keys for every env (set in place; returns ``traj``)."""
    steps = traj.trajectories
    if K.NEXT_ACTION_MASK not in steps:
        shape = (*steps[K.NEXT_REWARD].shape, n_actions)
        steps.set(K.NEXT_ACTION_MASK, torch.ones(shape, dtype=torch.bool, device=steps.device()))
    return traj

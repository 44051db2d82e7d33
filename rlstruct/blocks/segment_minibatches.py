"""PPO's batch: its advantages, its relabelling, and a recurrent model's row minibatches.

:func:`gae_advantages` and :func:`relabel` serve feed-forward models, whose minibatches are
shuffled transitions. A recurrent actor-critic (``--model mlp-lstm`` and kin) learns otherwise.

Its memory at step ``t`` is made by the steps before it, so each minibatch is a set of
whole env rows of the batch (:func:`row_minibatches`), replayed with
:func:`~rlstruct.blocks.recurrent.replay_rows` from the state the batcher stored at the segment's
start (``info["agent_state/h"]``; the agent restarts from zeros at episode starts, as it did
while acting), and the loss is taken over the valid steps only (:func:`replay_valid_steps`).
Advantages come from the stored values and :func:`~rlstruct.blocks.recurrent.bootstrap_values`
under the stored ``action/h`` (:func:`recurrent_gae`); a batch collected by an older policy is
relabelled by a gradient-free replay (:func:`relabel_recurrent`).

Example:
    >>> from rlstruct.temporal import TemporalDictTensor
    >>> steps = TemporalDictTensor({"x": torch.arange(12).view(4, 3)}, torch.tensor([3, 2, 3, 1]))
    >>> parts = row_minibatches(Trajectories(DictTensor(), steps), 2)
    >>> [p.trajectories["x"].shape for p in parts]
    [torch.Size([2, 3]), torch.Size([2, 3])]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.agent import Agent
from rlstruct.blocks import functional as F
from rlstruct.blocks import normalization
from rlstruct.blocks.masks import mask_head_params, stored_mask
from rlstruct.blocks.obs_input import model_input
from rlstruct.blocks.recurrent import STORED_STATE, bootstrap_values, replay_rows
from rlstruct.dicttensor import DictTensor
from rlstruct.errors import ConfigError
from rlstruct.trajectories import Trajectories

__all__ = ["row_minibatches", "row_split", "replay_valid_steps", "scaled_rewards",
           "gae_advantages", "recurrent_gae", "relabel", "relabel_recurrent"]


def row_minibatches(traj: Trajectories, n_minibatches: int,
                    generator: torch.Generator | None = None) -> list[Trajectories]:
    """The ``B`` rows of ``traj`` shuffled and cut into ``n_minibatches`` Trajectories of
    ``B / n_minibatches`` whole rows each (``info`` rows, the stored agent state among them,
    follow their rows).

    Args:
        traj: info ``(B, ...)`` and steps ``(B, T, *feat)``.
        n_minibatches: how many minibatches; must divide ``B``.
        generator: a CPU generator for a reproducible order.

    Raises:
        ConfigError: ``n_minibatches`` is below 1 or does not divide ``B``.
    """
    b = traj.n_elems()
    if n_minibatches < 1 or b % n_minibatches:
        raise ConfigError(f"n_minibatches ({n_minibatches}) must divide the batch's {b} env rows "
                          "(a recurrent model learns on whole rows)")
    order = torch.randperm(b, generator=generator).to(traj.device() or "cpu")
    return [traj.index(rows) for rows in order.chunk(n_minibatches)]


def replay_valid_steps(agent: Agent, traj: Trajectories) -> tuple[DictTensor, DictTensor]:
    """Replays ``agent`` over ``traj`` from its stored start state, with gradients; returns
    ``(replayed outputs (N, *feat), stored steps (N, *feat))`` on the ``N`` valid steps, row
    by row (padding dropped), aligned with each other."""
    return replay_rows(agent, traj).to_transitions(), traj.trajectories.to_transitions()


def scaled_rewards(model: Any, traj: Trajectories, gamma: float) -> Tensor:
    """The rewards ``(B, T)``; with ``--normalize-reward`` scaled by the returns' running std
    (``normalization.scale_rewards``; ``model.discounted`` carries each row's return on)."""
    steps, norm = traj.trajectories, getattr(model, "reward_norm", None)
    if norm is None:
        return steps[K.NEXT_REWARD]
    done = steps[K.NEXT_TERMINATED] | steps[K.NEXT_TRUNCATED]
    scaled, model.discounted = normalization.scale_rewards(
        norm, getattr(model, "discounted", None), steps[K.NEXT_REWARD], done, steps.lengths, gamma)
    return scaled


def gae_advantages(
    model: Any, traj: Trajectories, gamma: float, lam: float, current: bool = False
) -> tuple[Tensor, Tensor]:
    """GAE ``(advantages, returns)``, each ``(B, T)``, from the stored values and the critic's
    values of the true next observations (no gradient), on :func:`scaled_rewards`. With
    ``current`` (the stored values are this model's) step ``t``'s next value is step ``t+1``'s
    stored one, and the critic runs only where the next observation is not in the batch: an
    episode's end and a row's last step (a forward pass over the batch saved)."""
    steps = traj.trajectories
    value, done = steps[K.STORED_VALUE], steps[K.NEXT_TERMINATED] | steps[K.NEXT_TRUNCATED]
    t = torch.arange(value.shape[1], device=value.device)
    need = (done | (t >= steps.lengths.unsqueeze(1) - 1)) if current else torch.ones_like(done)
    next_value = torch.cat([value[:, 1:], value[:, -1:]], 1).clone()
    with torch.no_grad():
        next_obs = model_input(steps, K.NEXT_OBSERVATION)[need]
        next_value[need] = model.value(next_obs).to(value.dtype)
    return F.gae(scaled_rewards(model, traj, gamma), value, next_value, steps[K.NEXT_TERMINATED],
                 steps[K.NEXT_TRUNCATED], steps.lengths, gamma, lam)


def relabel(agent: Agent, traj: Trajectories) -> Trajectories:
    """``logp`` and ``value`` of the stored actions recomputed by the current model: with
    ``--pipeline 2`` the batch was collected one update ago, and the clip range must be measured
    from the policy being improved (or the first epoch starts outside it)."""
    steps, shape = traj.trajectories, traj.trajectories[K.STORED_VALUE].shape
    with torch.no_grad():
        params, value = agent.model(model_input(steps, K.OBSERVATION).flatten(0, 1))
        mask = stored_mask(steps)
        params = mask_head_params(agent.model.head, params,
                                  None if mask is None else mask.flatten(0, 1))
        logp = agent.model.head.log_prob(params, steps[K.STORED_SAMPLE].flatten(0, 1))
    steps.set(K.STORED_LOGP, logp.view(shape))
    steps.set(K.STORED_VALUE, value.view(shape))
    return traj


def recurrent_gae(model: torch.nn.Module, traj: Trajectories, gamma: float,
                  lam: float) -> tuple[Tensor, Tensor]:
    """GAE ``(advantages, returns)``, each ``(B, T)``, of a recurrent model's batch: from the
    stored ``action/value`` and the bootstrap values under the stored ``action/h``
    (gradient-free), on :func:`scaled_rewards`.

    Args:
        model: the recurrent actor-critic (``value(frame, h)``).
        traj: the batch, with ``action/value``, ``action/h`` and ``_observation/*``.
        gamma: the discount.
        lam: GAE's lambda.
    """
    steps = traj.trajectories
    value = steps[K.STORED_VALUE]
    next_value = bootstrap_values(model, traj, value, steps[STORED_STATE])
    return F.gae(scaled_rewards(model, traj, gamma), value, next_value, steps[K.NEXT_TERMINATED],
                 steps[K.NEXT_TRUNCATED], steps.lengths, gamma, lam)


def row_split(rows: int, n_timesteps: int, minibatch_size: int,
              n_minibatches: int | None) -> tuple[int, str | None]:
    """``(n_minibatches, problem)`` of a recurrent model's batch of ``rows`` env rows:
    ``n_minibatches`` or, when ``None``, ``rows * n_timesteps // minibatch_size`` (at least 1);
    the problem (a sentence) when it does not divide ``rows``, else ``None``."""
    n = n_minibatches or max(1, rows * n_timesteps // max(minibatch_size, 1))
    if n >= 1 and rows % n == 0:
        return n, None
    return n, (f"n_minibatches {n} must divide the batch's {rows} env rows (n_processes x "
               "n_envs): a recurrent model learns on minibatches of whole rows")


def relabel_recurrent(agent: Agent, traj: Trajectories) -> Trajectories:
    """``action/logp``, ``action/value`` and ``action/h`` of ``traj`` recomputed in place by a
    gradient-free replay of the current model from the stored start state (a batch collected
    one update ago, ``--pipeline 2``); returns ``traj``. ``agent.replay_key`` names the head
    params in the replay's outputs. The new ``action/h`` is whole after the steps a bootstrap
    reads (:func:`~rlstruct.blocks.recurrent.replay_rows`), all that the batch's GAE reads."""
    steps = traj.trajectories
    shape = steps[K.STORED_VALUE].shape
    with torch.no_grad():
        out = replay_rows(agent, traj)
        params = out[agent.replay_key].flatten(0, 1)
        logp = agent.model.head.log_prob(params, steps[K.STORED_SAMPLE].flatten(0, 1))
    steps.set(K.STORED_LOGP, logp.view(shape))
    steps.set(K.STORED_VALUE, out[K.VALUE].to(steps[K.STORED_VALUE].dtype))
    steps.set(STORED_STATE, out["h"].to(steps[STORED_STATE].dtype))
    return traj


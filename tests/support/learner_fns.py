"""Model factories and learn functions for learner-group tests, sent to the ranks by value
(``cloudpickle.register_pickle_by_value``): a toy regression, PPO's own loss, and faulty ones."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn

from rlstruct import DictTensor
from rlstruct import keys as K
from rlstruct.algos import ppo
from rlstruct.blocks.nets import head_actor_critic
from rlstruct.blocks.optim import gradient_step

N_STEPS = 5


def toy_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def adam(params, device=None) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1e-2)


def toy_loss(model: nn.Module, batch: DictTensor) -> torch.Tensor:
    return (model(batch["x"]).squeeze(-1) - batch["y"]).square().mean()


def toy_learn(ctx, batch: DictTensor, n_steps: int = N_STEPS) -> dict[str, float]:
    """``n_steps`` full-shard steps through the group's averaging step."""
    for _ in range(n_steps):
        loss = toy_loss(ctx.model, batch)
        ctx.step(ctx.optimizer, loss, 1.0)
    return {"loss": float(loss.detach()), "rows": float(batch.n_elems())}


def toy_reference(model: nn.Module, batch: DictTensor, n_steps: int = N_STEPS,
                  optimizer: torch.optim.Optimizer | None = None) -> None:
    """The same steps by a single learner in this process."""
    optimizer = optimizer or adam(model.parameters())
    for _ in range(n_steps):
        gradient_step(optimizer, toy_loss(model, batch), 1.0)


def toy_batch(n: int = 64, seed: int = 1) -> DictTensor:
    g = torch.Generator().manual_seed(seed)
    return DictTensor({"x": torch.randn(n, 8, generator=g), "y": torch.randn(n, generator=g)})


# ------------------------------------------------------------------------------------- PPO
PPO_CFG = ppo.Config(adv_norm="off", max_grad_norm=0.5, vf_coef=0.5, ent_coef=0.01)


def ppo_model() -> nn.Module:
    return head_actor_critic(4, {"n": 2}, 32)  # a categorical head over 2 actions


def ppo_learn(ctx, batch: DictTensor, n_steps: int = N_STEPS) -> dict[str, float]:
    agent = ppo.PPOAgent(ctx.model)
    for _ in range(n_steps):
        loss, stats = ppo.ppo_loss(agent, batch, PPO_CFG)
        ctx.step(ctx.optimizer, loss, PPO_CFG.max_grad_norm)
    return {k: float(v) for k, v in stats.items()}


def ppo_reference(model: nn.Module, batch: DictTensor, n_steps: int = N_STEPS) -> None:
    agent, optimizer = ppo.PPOAgent(model), adam(model.parameters())
    for _ in range(n_steps):
        loss, _ = ppo.ppo_loss(agent, batch, PPO_CFG)
        gradient_step(optimizer, loss, PPO_CFG.max_grad_norm)


def ppo_batch(n: int = 128, seed: int = 2) -> DictTensor:
    """A fixed batch of PPO transitions (observations, actions, old log-probs, values, ...)."""
    g = torch.Generator().manual_seed(seed)
    return DictTensor({
        K.OBS_FRAME: torch.randn(n, 4, generator=g),
        K.STORED_SAMPLE: torch.randint(0, 2, (n,), generator=g),  # the head's sample: the action
        K.STORED_LOGP: -torch.rand(n, generator=g) - 0.2,
        K.STORED_VALUE: torch.randn(n, generator=g),
        "advantage": torch.randn(n, generator=g),
        "return": torch.randn(n, generator=g),
    })


# ------------------------------------------------------------------------------------- faults
def killed_learn(ctx, batch: DictTensor, victim: int = 1, at: int = 1,
                 index: int = 0) -> dict[str, float]:
    """Rank ``victim`` is killed (SIGKILL) in the middle of batch ``at``, after one step."""
    loss = toy_loss(ctx.model, batch)
    ctx.step(ctx.optimizer, loss, 1.0)
    if ctx.rank == victim and index == at:
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.step(ctx.optimizer, toy_loss(ctx.model, batch), 1.0)
    return {"loss": float(loss.detach())}


def raising_learn(ctx, batch: DictTensor) -> dict[str, float]:
    if ctx.rank == 1:
        raise ValueError("bad reward scale in rank one")
    ctx.step(ctx.optimizer, toy_loss(ctx.model, batch), 1.0)
    return {}


def hanging_learn(ctx, batch: DictTensor) -> dict[str, float]:
    if ctx.rank == 1:
        time.sleep(600)  # a hung env or learn function
    ctx.step(ctx.optimizer, toy_loss(ctx.model, batch), 1.0)
    return {}


def failing_model() -> nn.Module:
    """Rank 1's factory fails (a typo in a layer size, a missing file...)."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("no checkpoint at weights.pt")
    return toy_model()


# ------------------------------------------------------------------- direct publication
def mlp_model() -> nn.Module:
    """The model of tests/support/agents.py's ``MLPAgent(obs_dim=3, n_actions=3, hidden=16)``."""
    return nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 3))


def mlp_learn(ctx, batch: DictTensor) -> dict[str, float]:
    """Two full-shard regression steps through the group's averaging step."""
    for _ in range(2):
        loss = (ctx.model(batch["x"]) - batch["y"]).square().mean()
        ctx.step(ctx.optimizer, loss, 1.0)
    return {"loss": float(loss.detach())}


def mlp_reference(model: nn.Module, batch: DictTensor,
                  optimizer: torch.optim.Optimizer) -> None:
    """:func:`mlp_learn`'s steps by a single learner in this process, on all the rows."""
    for _ in range(2):
        gradient_step(optimizer, (model(batch["x"]) - batch["y"]).square().mean(), 1.0)

"""TRPO (Schulman et al., 2015) on auto-reset segments, for Discrete and Box actions.

One iteration:

1. **Collect**: the training batcher steps ``B = n_processes * n_envs`` auto-reset envs for
   ``T`` steps with the current policy ``pi_old`` (a head of :mod:`rlstruct.blocks.distributions`,
   picked from the action space); the agent stores the env's ``action`` and the head's unclipped
   ``sample``. With ``--normalize-obs`` the running observation statistics are updated from the
   batch first; they are buffers of the model, so they travel with the weights.
2. **Advantages**: GAE(lambda) from the critic's values of the observations and of the TRUE next
   observations (terminated steps do not bootstrap; truncated steps and segment cuts do), on
   the rewards, which ``--normalize-reward`` divides by the running std of the discounted
   returns (rl-zoo's ``VecNormalize``). Advantages are normalised over the batch.
3. **Policy step**: maximise the surrogate ``L(theta) = mean(pi_theta(a|s) / pi_old(a|s) A)``
   subject to ``KL(pi_old || pi_theta) <= delta`` (``--max-kl``). With ``g = grad L`` and ``F``
   the Fisher matrix (the Hessian of the mean KL at ``theta_old``), the natural direction
   ``s = F^-1 g`` comes from ``cg_iters`` conjugate-gradient steps on Fisher-vector products
   ``F v = grad((grad KL) . v) + damping v`` (``F`` is never formed), scaled to the trust region:
   ``theta = theta_old + beta s``, ``beta = sqrt(2 delta / s.F s)``. A backtracking line search
   shrinks ``beta`` by ``backtrack`` until the measured KL is at most ``delta`` AND the
   surrogate improved; if no step qualifies the policy is left unchanged.
4. **Critic**: ``critic_epochs`` passes of minibatch Adam steps on ``(V(s) - R)^2`` (``--lr``).
5. **Publish**: ``run.publish`` (``batcher.update(state_dict)``, then ``execute()``).

With ``--n-learners N`` each rank holds ``B / N`` of the trajectories and all-reduces every
whole-batch quantity (:class:`~rlstruct.learners.rank.RankContext`): the observation statistics,
the advantages' mean and std, ``g``, each ``F v``, each line-search try's surrogate and KL; CG
runs identically on every rank. The critic's minibatches are ``minibatch_size / N`` rows per
rank. N ranks compute what one learner does (``tests/learners/test_learner_algos.py``).

Run: ``rlstruct train trpo --help``; ``rlstruct train trpo --env-id Pendulum-v1``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from rlstruct import Trajectories
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.algos.presets import TRPO_PRESETS
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.nets import HeadActorCritic, head_actor_critic
from rlstruct.blocks.obs_input import input_keys, model_input
from rlstruct.blocks.optim import adam, gradient_step
from rlstruct.blocks.sampling import PolicyAgent, greedy_info
from rlstruct.blocks.segment_minibatches import scaled_rewards
from rlstruct.envs import GymEnvInf
from rlstruct.errors import ConfigError, ShapeError
from rlstruct.learners.rank import RankContext
from rlstruct.runs.resolve import Resolved, run_cli
from rlstruct.runs.run import Run, RunConfig


@dataclass
class Config(RunConfig):
    """TRPO on auto-reset segments; defaults tuned for Pendulum-v1 (rlstruct train trpo)."""
    presets = TRPO_PRESETS  # --preset NAME: rlstruct/algos/presets.py
    learner_ranks: ClassVar[bool] = True  # --n-learners: Run.learner_group
    env_id: str = "Pendulum-v1"
    max_frames: int = 300_000
    target_return: float | None = -250.0
    n_timesteps: int = 128
    gamma: float = 0.9
    lr: float = 1e-3
    max_grad_norm: float = 0.0
    gae_lambda: float = 0.95
    """GAE lambda"""
    max_kl: float = 0.01
    """delta: the trust region, a bound on the mean KL(pi_old || pi_new) of each update"""
    cg_iters: int = 10
    """conjugate-gradient iterations for the natural direction"""
    cg_damping: float = 0.1
    """added to the Fisher-vector products (F + damping I): keeps CG stable"""
    backtrack: float = 0.8
    """the line search multiplies the step by this after each rejected try"""
    line_search_steps: int = 10
    """tries of the line search before the update is given up"""
    critic_epochs: int = 10
    """passes of minibatch Adam steps of the critic over each batch"""
    minibatch_size: int = 128
    """transitions per critic step"""
    normalize_obs: bool = True
    """normalise observations with running statistics (sent to the workers with the weights)"""
    normalize_reward: bool = False
    """divide rewards by the running std of the discounted returns (clipped to +-10)"""
    log_std_init: float = 0.0
    """initial log-std of a Gaussian policy (in the normalised action space [-1, 1])"""

    def problems(self) -> list[str]:
        problems = super().problems() + [f"{k} must be > 0, got {getattr(self, k)}" for k in
                                         ("max_kl", "cg_damping") if not getattr(self, k) > 0]
        ints = ("cg_iters", "line_search_steps", "critic_epochs", "minibatch_size")
        problems += [f"{k} must be >= 1, got {v}" for k in ints if (v := getattr(self, k)) < 1]
        if not 0 < self.backtrack < 1:
            problems.append(f"backtrack must be in (0, 1), got {self.backtrack}")
        if self.normalize_reward and self.layout.n_learners > 1:  # each rank's statistics
            problems.append("--normalize-reward takes one learner: its return statistics are not "
                            f"all-reduced over the {self.layout.n_learners} ranks (--n-learners)")
        return problems


# ---------------------------------------------------------------------------- model and agent
# HeadActorCritic (blocks/nets.py): actor MLP ending in the policy head, critic MLP, optional
# RunningNorms; PolicyAgent (blocks/sampling.py) stores action, sample, logp and value.
def critic_adam(params: Iterable[Tensor], device: Any = None, *, lr: float,
                n_critic: int) -> torch.optim.Optimizer:
    """Adam over the critic, the last ``n_critic`` of the parameters (a factory: every rank's)."""
    return adam(list(params)[-n_critic:], lr, device)


# --------------------------------------------------------------------------------------- losses
def surrogate(model: HeadActorCritic, x: Tensor, sample: Tensor, logp_old: Tensor,
              advantage: Tensor) -> Tensor:
    """``mean(exp(logp - logp_old) A)`` on the features ``x`` (differentiable in the actor)."""
    logp = model.head.log_prob(model.actor(x), sample)
    return ((logp - logp_old).exp() * advantage).mean()


def mean_kl(model: HeadActorCritic, x: Tensor, params_old: Tensor) -> Tensor:
    """``mean KL(pi_old || pi_theta)`` over the rows of ``x``."""
    return model.head.kl(params_old, model.actor(x)).mean()


def fisher_vector_product(model: HeadActorCritic, x: Tensor, params_old: Tensor,
                          damping: float,
                          mean: Callable[..., tuple[Tensor, ...]] = lambda *t: t) -> Any:
    """``v -> F v + damping v``: the Hessian of the mean KL at ``theta_old`` times ``v``, the
    Hessian-vector product of these rows averaged over the ranks by ``mean``."""
    params = list(model.actor.parameters())
    grads = torch.autograd.grad(mean_kl(model, x, params_old), params, create_graph=True)
    flat = torch.cat([g.reshape(-1) for g in grads])

    def fvp(v: Tensor) -> Tensor:
        hv = torch.autograd.grad(flat @ v, params, retain_graph=True)
        return mean(torch.cat([h.reshape(-1) for h in hv]))[0] + damping * v

    return fvp


def policy_step(model: HeadActorCritic, x: Tensor, sample: Tensor, advantage: Tensor,
                cfg: Config, ctx: RankContext | None = None) -> dict[str, float]:
    """The natural-gradient step with a backtracking line search (see the module docstring);
    ``g``, ``F v``, the surrogate and the KL are means over all the ranks' rows."""
    ctx = ctx or RankContext.of()  # its collectives are the identity for one learner
    mean = partial(ctx.all_reduce_mean, weight=x.shape[0])
    params = list(model.actor.parameters())
    with torch.no_grad():
        params_old = model.actor(x)
        logp_old = model.head.log_prob(params_old, sample)
    loss_old = surrogate(model, x, sample, logp_old, advantage)
    g = mean(parameters_to_vector(torch.autograd.grad(loss_old, params)))[0]
    fvp = fisher_vector_product(model, x, params_old, cfg.cg_damping, mean)
    direction = F.conjugate_gradient(fvp, g, cfg.cg_iters)
    shs = (direction @ fvp(direction)).clamp(min=1e-12)
    step = direction * torch.sqrt(2 * cfg.max_kl / shs)
    theta_old = parameters_to_vector(params).detach()
    with torch.no_grad():
        for i in range(cfg.line_search_steps):
            vector_to_parameters(theta_old + cfg.backtrack**i * step, params)
            improve, kl = mean(surrogate(model, x, sample, logp_old, advantage) - loss_old,
                               mean_kl(model, x, params_old))
            if kl <= cfg.max_kl and improve > 0:
                return {"kl": float(kl), "improvement": float(improve), "line_search": i}
        vector_to_parameters(theta_old, params)  # no step qualified: keep pi_old
    return {"kl": 0.0, "improvement": 0.0, "line_search": cfg.line_search_steps}


def critic_step(model: HeadActorCritic, optimizer: torch.optim.Optimizer, x: Tensor,
                returns: Tensor, cfg: Config, step: Any = gradient_step) -> float:
    """``critic_epochs`` passes of minibatch steps on ``0.5 (V(s) - R)^2`` through ``step``
    (a rank's averages the gradients over the ranks); the last loss."""
    loss = torch.zeros(())
    for _ in range(cfg.critic_epochs):
        for rows in torch.randperm(x.shape[0], device=x.device).split(cfg.minibatch_size):
            loss = 0.5 * (model.critic(x[rows]).squeeze(-1) - returns[rows]).square().mean()
            step(optimizer, loss, cfg.max_grad_norm)
    return float(loss.detach())


def learn(model: HeadActorCritic, optimizer: torch.optim.Optimizer, traj: Trajectories,
          cfg: Config, step: Any = gradient_step) -> dict[str, float]:
    """Statistics, advantages, one policy step and the critic's steps on one batch; each of
    ``--n-learners N`` ranks on ``B / N`` trajectories, its ``step`` all-reducing the rest."""
    ctx = RankContext.of(step)
    steps = traj.trajectories
    if K.OBS_ACTION_MASK in steps:  # policy_step rebuilds the policy from unmasked features
        raise ConfigError(f"trpo does not honour {cfg.env_id}'s action masks yet: use ppo or a2c")
    valid = model_input(steps.get(input_keys(steps)).to_transitions(), K.OBSERVATION)
    model.observe(ctx.all_gather_rows(valid) if isinstance(valid, Tensor) else valid)  # the batch's
    reward = scaled_rewards(model, traj, cfg.gamma)  # --normalize-reward: by the returns' std
    with torch.no_grad():  # the critic's values of the observations and the true next ones
        value, next_value = (model.value(model_input(steps, k).flatten(0, 1)).view(reward.shape)
                             for k in (K.OBSERVATION, K.NEXT_OBSERVATION))
    advantage, returns = F.gae(
        reward, value, next_value, steps[K.NEXT_TERMINATED],
        steps[K.NEXT_TRUNCATED], steps.lengths, cfg.gamma, cfg.gae_lambda,
    )
    batch = steps.get([*input_keys(steps), K.STORED_SAMPLE])
    batch.set("advantage", advantage)
    batch.set("return", returns)
    batch = batch.to_transitions()  # the N valid steps
    with torch.no_grad():
        x = model.features(model_input(batch, K.OBSERVATION))
    whole = ctx.all_gather_rows(batch["advantage"])  # normalised over the whole batch:
    adv = (batch["advantage"] - whole.mean()) / (whole.std(correction=0) + 1e-8)  # as F's
    if whole.shape[0] != x.shape[0] * ctx.world_size:  # the critic's step counts would differ
        raise ShapeError(f"TRPO rank {ctx.rank}: {x.shape[0]} valid steps, but the "
                         f"{ctx.world_size} ranks hold {whole.shape[0]}: shards must be equal")
    stats = policy_step(model, x, batch[K.STORED_SAMPLE], adv, cfg, ctx)
    stats["value_loss"] = critic_step(model, optimizer, x, batch["return"], cfg, step)
    return stats


# --------------------------------------------------------------------------------------- main
def main(cfg: Config | Resolved[Config]) -> dict[str, Any]:
    """Trains until the target return, ``max_frames`` or ``time_budget``; returns the summary."""
    with Run("trpo", cfg) as run:
        cfg = run.cfg  # resolved: the layout file applied, --resume auto picked
        make_model = run.factory(head_actor_critic, run.obs_dim, space_spec(run.action_space),
                                 cfg.hidden, cfg.log_std_init, cfg.normalize_obs,
                                 normalize_reward=cfg.normalize_reward)  # the ranks' too
        model = run.model(make_model)  # on the CPU: the batchers copy it
        batcher = run.training_batcher(PolicyAgent, {"model": model}, GymEnvInf, cfg.n_timesteps)
        run.evaluator(PolicyAgent, {"model": model}, agent_info=greedy_info())
        make_optimizer = partial(critic_adam, lr=cfg.lr,  # the critic's own
                                 n_critic=len(list(model.critic.parameters())))
        group = run.learner_group(make_model, model, make_optimizer, learn,
                                  per_rank=("minibatch_size",))  # --n-learners N
        # 1. Each segment the workers collected with pi_old, until the stop test.
        for traj in run.segments(batcher):
            # 2-4. Advantages, the trust-region policy step and the critic's steps (--n-learners
            # N: each rank on 1/N of the rows, every whole-batch quantity all-reduced).
            stats = group.learn(traj)
            weights = group.state_dict()
            # 5. Publish the weights (and the observation statistics) and collect again.
            run.publish(batcher, weights)
            run.end_iteration(weights, **stats)
    return run.summary


if __name__ == "__main__":
    run_cli(main, Config, prog="python -m rlstruct.algos.trpo")

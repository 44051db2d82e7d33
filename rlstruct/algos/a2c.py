"""A2C with GAE(lambda) on auto-reset segments, on any model of the zoo (``--model``).

One iteration:

1. **Collect**: the training batcher steps ``B = n_processes * n_envs`` auto-reset envs
   (``GymEnvInf``) for ``T`` steps. The agent stores the env's ``action``, the policy head's
   unclipped ``sample`` (``rlstruct.blocks.distributions``: softmax for Discrete, a Gaussian
   rescaled and clipped into a Box), its ``logp`` and the ``value``. A feed-forward model
   (``--model mlp|cnn``) acts through ``PolicyAgent``; a recurrent one (``mlp-lstm``,
   ``mlp-gru``, ``cnn-lstm``, ``cnn-gru``) through ``RecurrentAgent``, which carries ``h`` in
   its state, resets it where ``observation["initial_state"]`` is true, and whose batcher
   records the state at the segment start in ``info["agent_state/h"]``.
2. **Replay** the agent on the learner device, with gradients: ``replay_rows`` for a recurrent
   model, from the stored ``agent_state/h`` (the memory of an episode begun in an earlier
   segment is restored exactly); ``replay_agent_stateless`` (one batched call) otherwise.
3. **One gradient step** on ``-logp(a) A + vf_coef (V - R)^2 - ent_coef H`` with GAE(lambda)
   advantages ``A`` and returns ``R``. ``V'`` of the TRUE next observations is the next step's
   replayed value inside an episode and a segment, else the model's value of
   ``_observation/frame`` (``bootstrap_values``; a recurrent model under the replayed state
   after the step): terminated steps do not bootstrap, truncated steps and segment cuts do.
   ``--optimizer adam`` (the default) or ``rmsprop`` (TensorFlow's RMSprop, rl-zoo's).
4. **Publish**: ``run.publish``. With ``--pipeline 2`` the workers already collect the next
   segment while the learner learns on this one (one update of policy lag).

Run: ``python -m rlstruct.algos.a2c --help``; ``python -m rlstruct.algos.a2c --model mlp-gru``;
``python -m rlstruct.algos.a2c --preset atari`` (rl-zoo's Pong settings).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Literal

from gymnasium.spaces import Discrete
from torch import Tensor, nn

from rlstruct import Agent, TemporalDictTensor, Trajectories
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.agent_replay import replay_agent_stateless
from rlstruct.algos.presets import A2C_PRESETS
from rlstruct.blocks.distributions import ActionHead, space_spec
from rlstruct.blocks.optim import Optimizer, adam, gradient_step, rmsprop_tf
from rlstruct.blocks.recurrent import STATE, RecurrentAgent, bootstrap_values, replay_rows
from rlstruct.blocks.sampling import PolicyAgent, greedy_info
from rlstruct.blocks.zoo import RECURRENT_MODELS, actor_critic, is_recurrent, model_problems
from rlstruct.envs import GymEnvInf
from rlstruct.runs.presets import Preset
from rlstruct.runs.resolve import Resolved, run_cli
from rlstruct.runs.run import Run, RunConfig


@dataclass
class Config(RunConfig):
    """A2C with GAE on auto-reset segments; defaults tuned for CartPole-v1 (rlstruct train a2c)."""
    learner_ranks: ClassVar[bool] = True  # --n-learners: Run.learner_group
    presets: ClassVar[dict[str, Preset]] = A2C_PRESETS
    eval_every: int = 50
    checkpoint_every: int = 200
    lr: float = 4e-3
    model: Literal["mlp", "cnn", "mlp-lstm", "mlp-gru", "cnn-lstm", "cnn-gru"] = "mlp"
    """the zoo's actor-critic (rlstruct/blocks/zoo.py): mlp, the Nature CNN on stacked frames
    (--env-backend atari), or a recurrent one whose memory is replayed from the stored state"""
    optimizer: Literal["adam", "rmsprop"] = "adam"
    """adam, or RMSprop as TensorFlow has it (alpha 0.99, eps 1e-5 inside the square root)"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    vf_coef: float = 0.5
    """weight of the value loss, the mean of (V - R)^2"""
    ent_coef: float = 0.0
    """weight of the entropy bonus"""
    normalize_advantages: bool = True
    """normalise advantages over the batch's valid steps (mean 0, std 1)"""

    def world_problems(self, obs_shape: tuple[int, ...], action_space: Any) -> list[str]:
        problems = super().world_problems(obs_shape, action_space)
        problems += model_problems(self.model, obs_shape, self.env_id)
        if self.model == "cnn" and not isinstance(action_space, Discrete):
            problems.append(f"--model cnn takes Discrete actions, but {self.env_id}'s are "
                            f"{action_space}: use a cnn-lstm or cnn-gru model")
        return problems


# --------------------------------------------------------------------------------------- agent
def agent_class(model: str) -> type[Agent]:
    """The agent of ``--model model``: ``RecurrentAgent`` for a recurrent one (state ``h``,
    replayed from ``agent_state/h``), else the memoryless ``PolicyAgent`` (both return the
    head's ``sample`` and ``logp`` and the ``value``; ``call_replay`` the ``params``)."""
    return RecurrentAgent if model in RECURRENT_MODELS else PolicyAgent


def make_optimizer(cfg: Config) -> partial[Optimizer]:
    """``make_optimizer(params, device=...)`` of ``--optimizer`` at ``--lr``."""
    return partial(rmsprop_tf if cfg.optimizer == "rmsprop" else adam, lr=cfg.lr)


# --------------------------------------------------------------------------------------- loss
def replay(agent: Agent, traj: Trajectories) -> TemporalDictTensor:
    """The agent's outputs ``(B, T, ...)`` with gradients (a recurrent one from agent_state):
    ``params``, ``value`` (and ``h``, the state after each step, for a recurrent model)."""
    return (replay_rows if is_recurrent(agent.model) else replay_agent_stateless)(agent, traj)


class _Memoryless:
    """A feed-forward model seen as a recurrent one of state size 0 (for bootstrap_values)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def value(self, frame: Tensor, h: Tensor) -> Tensor:
        return self.model.value(frame)


def next_values(model: nn.Module, traj: Trajectories, out: TemporalDictTensor) -> Tensor:
    """``V'`` ``(B, T)`` of the TRUE next observations, gradient-free: the next step's replayed
    value inside an episode and a segment, else the model's value of ``_observation/frame``
    (a recurrent model's under ``out["h"]``, the replayed state after the step)."""
    value = out[K.VALUE]
    if is_recurrent(model):
        return bootstrap_values(model, traj, value, out[STATE])
    no_state = value.new_zeros(*value.shape, 0)
    return bootstrap_values(_Memoryless(model), traj, value, no_state)  # type: ignore[arg-type]


def a2c_loss(
    head: ActionHead, params: Tensor, value: Tensor, next_value: Tensor, traj: Trajectories,
    cfg: Config,
) -> tuple[Tensor, dict[str, float]]:
    """The A2C loss over ``(B, T)`` steps (padding ignored) from the policy ``head``, its
    ``params (B, T, P)`` and ``value (B, T)`` of the stored observations (with gradients) and
    ``next_value (B, T)`` of the true next ones (none); ``(loss, stats)``: ``loss``,
    ``policy_loss``, ``value_loss``, ``entropy``."""
    steps, mask = traj.trajectories, traj.trajectories.mask()
    advantage, returns = F.gae(
        steps[K.NEXT_REWARD], value.detach(), next_value, steps[K.NEXT_TERMINATED],
        steps[K.NEXT_TRUNCATED], steps.lengths, cfg.gamma, cfg.gae_lambda,
    )
    if cfg.normalize_advantages:  # over the valid steps: the step size ignores the reward scale
        advantage = F.normalize_advantages(advantage, mask)
    logp = head.log_prob(params, steps[K.STORED_SAMPLE])
    policy_loss = -F.masked_mean(logp * advantage, mask)
    value_loss = F.masked_mean((value - returns) ** 2, mask)
    entropy = F.masked_mean(head.entropy(params), mask)
    loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
    stats = {"loss": loss, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy}
    return loss, {k: float(v.detach()) for k, v in stats.items()}


def learn(agent: Agent, optimizer: Optimizer, traj: Trajectories, cfg: Config,
          step: Any = gradient_step) -> dict[str, float]:
    """Replay, the loss, one gradient step (``step`` averages it over --n-learners ranks)."""
    out = replay(agent, traj)
    loss, stats = a2c_loss(agent.model.head, out["params"], out[K.VALUE],
                           next_values(agent.model, traj, out), traj, cfg)
    step(optimizer, loss, cfg.max_grad_norm)
    return stats


# --------------------------------------------------------------------------------------- main
def main(cfg: Config | Resolved[Config]) -> dict[str, Any]:
    """Trains until the target return, ``max_frames`` or ``time_budget``; returns the summary."""
    with Run("a2c", cfg) as run:
        cfg = run.cfg  # resolved: the layout file applied, --resume auto picked
        make_model = run.factory(actor_critic, cfg.model, tuple(run.obs_shape),
                                 space_spec(run.action_space), cfg.hidden)
        model = run.model(make_model)  # on the CPU: the batchers copy it
        agent = agent_class(cfg.model)
        batcher = run.training_batcher(agent, {"model": model}, GymEnvInf, cfg.n_timesteps)
        run.evaluator(agent, {"model": model}, agent_info=greedy_info())
        group = run.learner_group(make_model, model, make_optimizer(cfg), learn, agent)
        # 1. Each segment the workers collected with the current policy, until the stop test.
        for traj in run.segments(batcher):
            # 2-3. Replay on the learner device, one gradient step (--n-learners: on N ranks).
            stats = group.learn(traj)
            weights = group.state_dict()
            # 4. Publish the weights; the workers collect the next segment meanwhile.
            run.publish(batcher, weights)
            run.end_iteration(weights, lr=cfg.lr, **stats)
    return run.summary


if __name__ == "__main__":
    run_cli(main, Config, prog="python -m rlstruct.algos.a2c")

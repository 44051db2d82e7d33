"""What ``rlstruct tune --algo rlstruct.algos.tuning:<name>`` measures for an algorithm
here.

The library imports no algorithm: each function below hands the tuner an algorithm's agent and
model on its gymnasium env (``GymEnvInf``, as ``Run.training_batcher`` builds it), the weights it
publishes after each batch, its seed, its batch size, and its own learn step on one batch (on
the CPU, as the algorithm's ``main`` calls it), so that a layout is measured under the learner.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch

from rlstruct.algos import a2c as _a2c
from rlstruct.algos import impala as _impala
from rlstruct.algos import ppo as _ppo
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.nets import head_actor_critic
from rlstruct.blocks.optim import adam, gradient_step
from rlstruct.blocks.zoo import actor_critic
from rlstruct.envs import GymEnvInf
from rlstruct.errors import ConfigError
from rlstruct.learners.local import LocalLearner
from rlstruct.learners.rank import algorithm_learn
from rlstruct.runs.run import env_spaces
from rlstruct.tools.tune import AlgoSetup
from rlstruct.trajectories import Trajectories


def _setup(module: Any, model_fn: Any, agent: Any, learner: Any, **overrides: Any) -> AlgoSetup:
    cfg = module.Config(**overrides)
    if cfg.env_backend != "gymnasium":
        raise ConfigError(f"the tuner measures gymnasium envs, not env_backend={cfg.env_backend!r}")
    shape, space = env_spaces(cfg.env_id)
    model = model_fn(math.prod(shape), space, cfg)
    rows = (cfg.layout.n_processes or 1) * cfg.layout.n_envs
    learn = learner(model, cfg)
    return AlgoSetup(agent, {"model": model}, GymEnvInf, {"env": cfg.env_id},
                     weights=model.state_dict(), seed=cfg.seed, pipelined=True,
                     name=module.__name__.rsplit(".", 1)[-1], env_id=cfg.env_id,
                     learn=learn, batch_size=rows * cfg.n_timesteps)


def _ppo_learner(model: Any, cfg: Any) -> Any:
    agent = _ppo.PPOAgent(model)
    optimizer = adam(model.parameters(), cfg.lr, "cpu", eps=1e-5)  # as in ppo.main
    return lambda traj: _ppo.learn(agent, optimizer, traj.to("cpu"), cfg)


def _a2c_learner(model: Any, cfg: Any) -> Any:
    agent = _a2c.agent_class(cfg.model)(model)
    optimizer = _a2c.make_optimizer(cfg)(model.parameters(), device="cpu")  # as in a2c.main

    def learn(traj: Trajectories) -> None:
        traj = traj.to("cpu")
        out = _a2c.replay(agent, traj)
        loss, _ = _a2c.a2c_loss(model.head, out["params"], out["value"],
                                _a2c.next_values(model, traj, out), traj, cfg)
        gradient_step(optimizer, loss, cfg.max_grad_norm)

    return learn


def ppo(**overrides: Any) -> AlgoSetup:
    """PPO's actor-critic, agent and learn step; ``overrides`` are fields of its Config."""
    def model(obs_dim: int, space: Any, cfg: Any) -> Any:
        return head_actor_critic(obs_dim, space_spec(space), cfg.hidden, cfg.log_std_init,
                                 cfg.normalize_obs)

    return _setup(_ppo, model, _ppo.PPOAgent, _ppo_learner, **overrides)


def a2c(**overrides: Any) -> AlgoSetup:
    """A2C's model of the zoo (``model="mlp-gru"``: a recurrent one), agent and gradient
    step."""
    def model(obs_dim: int, space: Any, cfg: Any) -> Any:
        return actor_critic(cfg.model, (obs_dim,), space_spec(space), cfg.hidden)

    return _setup(_a2c, model, _a2c.agent_class(overrides.get("model", "mlp")), _a2c_learner,
                  **overrides)


def impala(**overrides: Any) -> AlgoSetup:
    """IMPALA's actor-critic, behaviour agent and V-trace step (here in the collecting thread,
    where ``main`` runs it in a learner thread: the same cost per batch)."""
    return _setup(_impala, lambda obs_dim, space, cfg: actor_critic(
        cfg.model, (obs_dim,), space_spec(space), cfg.hidden),
                  _impala.BehaviourAgent, _impala_learner, **overrides)


def _impala_learner(model: Any, cfg: Any) -> Any:
    group = LocalLearner(model, partial(adam, lr=cfg.lr, eps=1e-5),
                         partial(algorithm_learn, learn=_impala.learn,
                                 make_agent=_impala.BehaviourAgent, cfg=cfg), torch.device("cpu"))
    return _impala.Learner(group)  # as in impala.main, with its one-rank learner group

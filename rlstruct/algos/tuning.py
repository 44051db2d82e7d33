"""What ``rlstruct tune --algo rlstruct.algos.tuning:<name>`` measures for an algorithm
here.

The library imports no algorithm: each function below hands the tuner an algorithm's agent and
model on its training envs (as ``Run.training_batcher`` builds them: gymnasium's ``GymEnvInf``,
or the env backend the config names, ``atari`` and ``envpool`` included), the weights it
publishes after each batch, its seed, its batch size, and its own learn step on one batch (on
the CPU, as the algorithm's ``main`` calls it), so that a layout is measured under the learner.
Each takes its ``Config``'s fields as keywords, and ``preset=NAME`` for one of its presets
(``ppo(preset="atari", env_backend="envpool")``: the Nature CNN on Pong's frames).
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
from rlstruct.learners.local import LocalLearner
from rlstruct.learners.rank import algorithm_learn
from rlstruct.runs.resolve import resolve
from rlstruct.runs.training_env import training_env
from rlstruct.tools.tune import AlgoSetup
from rlstruct.trajectories import Trajectories


def _setup(module: Any, model_fn: Any, agent_for: Any, learner: Any,
           preset: str | None = None, **overrides: Any) -> AlgoSetup:
    name = module.__name__.rsplit(".", 1)[-1]
    # a run's own checks and spaces (the frames as its env backend stacks them)
    resolved = resolve(module.Config.from_preset(preset, **overrides) if preset
                       else module.Config(**overrides), name)
    cfg = resolved.cfg
    create_env, env_args = training_env(name, cfg, GymEnvInf, torch.device("cpu"))
    if cfg.env_backend == "envpool":  # the candidates' worker counts vary: one thread each
        env_args["num_threads"] = 1
    model = model_fn(tuple(resolved.obs_shape), resolved.action_space, cfg)
    rows = (cfg.layout.n_processes or 1) * cfg.layout.n_envs
    learn = learner(model, cfg)
    return AlgoSetup(agent_for(cfg), {"model": model}, create_env,
                     {k: v for k, v in env_args.items() if k != "n_envs"},
                     weights=model.state_dict(), seed=cfg.seed, pipelined=True,
                     name=name, env_id=cfg.env_id, learn=learn,
                     batch_size=rows * cfg.n_timesteps, env_backend=cfg.env_backend)


def _model_shape(shape: tuple[int, ...], cfg: Any) -> tuple[int, ...]:
    """The observation shape a zoo model takes: the frames for a CNN, flat features else."""
    return shape if cfg.model.startswith("cnn") else (math.prod(shape),)


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
    def model(shape: tuple[int, ...], space: Any, cfg: Any) -> Any:
        if cfg.model != "mlp":  # the zoo's, as ppo.model_factory builds it
            return actor_critic(cfg.model, shape, space_spec(space), cfg.hidden,
                                **cfg.mlp_options())
        return head_actor_critic(math.prod(shape), space_spec(space), cfg.hidden,
                                 cfg.log_std_init, cfg.normalize_obs)

    return _setup(_ppo, model, lambda cfg: _ppo.PPOAgent, _ppo_learner, **overrides)


def a2c(**overrides: Any) -> AlgoSetup:
    """A2C's model of the zoo (``model="mlp-gru"``: a recurrent one), agent and gradient
    step."""
    def model(shape: tuple[int, ...], space: Any, cfg: Any) -> Any:
        return actor_critic(cfg.model, _model_shape(shape, cfg), space_spec(space), cfg.hidden)

    return _setup(_a2c, model, lambda cfg: _a2c.agent_class(cfg.model), _a2c_learner,
                  **overrides)


def impala(**overrides: Any) -> AlgoSetup:
    """IMPALA's actor-critic, behaviour agent and V-trace step (here in the collecting thread,
    where ``main`` runs it in a learner thread: the same cost per batch)."""
    return _setup(_impala, lambda shape, space, cfg: actor_critic(
        cfg.model, _model_shape(shape, cfg), space_spec(space), cfg.hidden),
                  lambda cfg: _impala.BehaviourAgent, _impala_learner, **overrides)


def _impala_learner(model: Any, cfg: Any) -> Any:
    group = LocalLearner(model, _impala.make_optimizer(cfg),
                         partial(algorithm_learn, learn=_impala.learn,
                                 make_agent=_impala.BehaviourAgent, cfg=cfg), torch.device("cpu"))
    return _impala.Learner(group)  # as in impala.main, with its one-rank learner group

"""What ``python -m rlstruct tune --algo algos.tuning:<name>`` measures for an algorithm here.

The library imports no algorithm: each function below hands the tuner an algorithm's agent and
model on its gymnasium env (``GymEnvInf``, as ``Run.training_batcher`` builds it), the weights it
publishes after each batch, its seed, and whether it learns from a pipelined batcher.
"""

from __future__ import annotations

from typing import Any

from algos import a2c as _a2c
from algos import impala as _impala
from algos import ppo as _ppo
from rlstruct.envs import GymEnvInf
from rlstruct.errors import ConfigError
from rlstruct.run import env_dims
from rlstruct.tune import AlgoSetup


def _setup(module: Any, model_cls: Any, agent: Any, **overrides: Any) -> AlgoSetup:
    cfg = module.Config(**overrides)
    if cfg.env_backend != "gymnasium":
        raise ConfigError(f"the tuner measures gymnasium envs, not env_backend={cfg.env_backend!r}")
    model = model_cls(*env_dims(cfg.env_id), cfg.hidden)
    return AlgoSetup(agent, {"model": model}, GymEnvInf, {"env": cfg.env_id},
                     weights=model.state_dict(), seed=cfg.seed, pipelined=True,
                     name=module.__name__.rsplit(".", 1)[-1], env_id=cfg.env_id)


def ppo(**overrides: Any) -> AlgoSetup:
    """PPO's actor-critic and agent; ``overrides`` are fields of ``algos.ppo.Config``."""
    return _setup(_ppo, _ppo.ActorCritic, _ppo.PPOAgent, **overrides)


def a2c(**overrides: Any) -> AlgoSetup:
    """A2C's model (the GRU one with ``recurrent=True``) and agent."""
    net = _a2c.GRUActorCritic if overrides.get("recurrent") else _a2c.MLPActorCritic
    return _setup(_a2c, net, _a2c.A2CAgent, **overrides)


def impala(**overrides: Any) -> AlgoSetup:
    """IMPALA's actor-critic and behaviour agent."""
    return _setup(_impala, _impala.ActorCritic, _impala.BehaviourAgent, **overrides)

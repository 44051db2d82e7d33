"""rlstruct: device-aware tensor structures, batchers and device contracts for RL in PyTorch.

The public surface (everything else is internal). The core::

    from rlstruct import (DictTensor, TemporalDictTensor, Trajectories,
                          masked_tensor, masked_dicttensor,
                          Agent, replay_agent, replay_agent_stateless, CheckDevice,
                          Batcher, SerialBatcher, RestartPolicy, LearnerThread)
    from rlstruct.envs import VecEnv, GymEnv, GymEnvInf, DeviceEnv
    from rlstruct import functional as F     # returns, GAE, V-trace, the policy-loss terms
    from rlstruct.blocks.policy_terms import conjugate_gradient   # also F.conjugate_gradient
    from rlstruct.errors import RLStructError, ShapeError, DeviceContractError, ...
    from rlstruct.devices import resolve_device
    from rlstruct.blocks.replay_buffer import ReplayBuffer

The experiment layer, which the algorithms of ``rlstruct/algos/`` are written with::

    from rlstruct.runs.run import Run, RunConfig            # the run scaffold and shared config
    from rlstruct.envs.registry import EnvModules, env_id_problems  # custom envs, id checks
    from rlstruct.runs.checkpoint import save_checkpoint, load_checkpoint  # safe checkpoint files
    from rlstruct.tools.evaluate import evaluate             # replay a saved policy greedily
    from rlstruct.batchers.make import make_batcher       # the batcher a layout calls for
    from rlstruct.runs.layout import LayoutConfig          # device layouts
    from rlstruct.runs.evaluator import Evaluator          # evaluation in a worker process
    from rlstruct.runs.episodes import EpisodeTracker       # episode returns, keyed by env_id
    from rlstruct.runs.logger import RunLogger              # the run directory
    from rlstruct.runs.plotting import plot_runs            # returns.png, comparisons
    from rlstruct.runs.folder import read_run           # a run folder read back
    from rlstruct.blocks.nets import mlp                      # orthogonally initialised MLPs
    from rlstruct.blocks.distributions import make_head       # policy heads for any action space
    from rlstruct.blocks.normalization import RunningNorm     # observation statistics
    from rlstruct.blocks.optim import adam, gradient_step     # fused Adam; one meaning of clipping
    from rlstruct.blocks.sampling import CategoricalSampler, ActorAgent, PolicyAgent, greedy_info
                                                       # seeded sampling, greedy evaluation
    from rlstruct.learners.group import LearnerGroup    # data-parallel learner ranks
    from rlstruct.learners.base import LearnerGroupBase   # what every learner group shares
    from rlstruct.learners.rank import RankContext      # what a rank's learn function gets
    from rlstruct.learners.staging import StagingRing           # shards staged onto rank devices
    from rlstruct.learners.torchrun import TorchrunLearnerGroup   # rank 0 under torchrun
    from rlstruct.learners.ray_group import RayLearnerGroup   # learner ranks as Ray actors

A trained policy, in one line (imported at first use, see :mod:`rlstruct.runs.policy`)::

    policy = rlstruct.load_policy("runs/ppo_CartPole-v1_...")   # action = policy.act(obs)

``rlstruct.compat`` keeps rlstructures' names for a port. ``rlstruct plot runs/``
plots run directories (see :mod:`rlstruct.runs.plotting`); ``rlstruct evaluate RUN_DIR``
plays a saved policy (see :mod:`rlstruct.tools.evaluate`); ``rlstruct --help`` lists every
command.
"""
# ruff: noqa: E402 (the imports follow the first line that every rlstruct command runs)
from __future__ import annotations

from rlstruct.parallel import openmp, startup

openmp.prefer_passive()  # before torch loads OpenMP: waiting threads sleep (parallel/openmp.py)
startup.install_if_command()  # a command's SIGTERM and Ctrl-C are graceful from here on

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load at first use
    from rlstruct import keys
    from rlstruct.agent import Agent
    from rlstruct.agent_replay import replay_agent, replay_agent_stateless
    from rlstruct.batchers import Batcher, RestartPolicy, SerialBatcher
    from rlstruct.blocks import functional
    from rlstruct.checks import CheckDevice
    from rlstruct.dicttensor import DictTensor, masked_dicttensor, masked_tensor
    from rlstruct.learners.thread import LearnerThread
    from rlstruct.runs.policy import load_policy
    from rlstruct.temporal import TemporalDictTensor
    from rlstruct.trajectories import Trajectories

__version__ = "0.1.0"

__all__ = [
    "DictTensor",
    "TemporalDictTensor",
    "Trajectories",
    "masked_tensor",
    "masked_dicttensor",
    "Agent",
    "replay_agent",
    "replay_agent_stateless",
    "CheckDevice",
    "Batcher",
    "SerialBatcher",
    "RestartPolicy",
    "LearnerThread",
    "functional",
    "keys",
    "load_policy",
]

#: Where each public name lives: imported at first use (PEP 562), so that ``import rlstruct``
#: (what every ``rlstruct`` command runs first) imports neither torch nor gymnasium until a name
#: is used: ``rlstruct --help`` answers in a fraction of a second. ``load_policy`` is of a
#: higher layer (:mod:`rlstruct.runs.policy`).
_LAZY = {
    "DictTensor": "rlstruct.dicttensor", "masked_tensor": "rlstruct.dicttensor",
    "masked_dicttensor": "rlstruct.dicttensor", "TemporalDictTensor": "rlstruct.temporal",
    "Trajectories": "rlstruct.trajectories", "Agent": "rlstruct.agent",
    "replay_agent": "rlstruct.agent_replay", "replay_agent_stateless": "rlstruct.agent_replay",
    "CheckDevice": "rlstruct.checks", "Batcher": "rlstruct.batchers",
    "SerialBatcher": "rlstruct.batchers", "RestartPolicy": "rlstruct.batchers",
    "LearnerThread": "rlstruct.learners.thread", "load_policy": "rlstruct.runs.policy",
}
#: Public submodules, imported at first use like the names.
_MODULES = {"keys": "rlstruct.keys", "functional": "rlstruct.blocks.functional"}


def __getattr__(name: str) -> Any:
    """A public name (:data:`_LAZY`) or submodule (:data:`_MODULES`), imported at first use."""
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

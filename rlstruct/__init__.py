"""rlstruct: device-aware tensor structures, batchers and device contracts for RL in PyTorch.

The public surface (everything else is internal). The core::

    from rlstruct import (DictTensor, TemporalDictTensor, Trajectories,
                          masked_tensor, masked_dicttensor,
                          Agent, replay_agent, replay_agent_stateless, CheckDevice,
                          Batcher, SerialBatcher, RestartPolicy, LearnerThread)
    from rlstruct.envs import VecEnv, GymEnv, GymEnvInf, DeviceEnv
    from rlstruct import functional as F
    from rlstruct.errors import RLStructError, ShapeError, DeviceContractError, ...
    from rlstruct.devices import resolve_device
    from rlstruct.replay_buffer import ReplayBuffer

The experiment layer, which the algorithms of ``algos/`` are written with::

    from rlstruct.run import Run, RunConfig            # the run scaffold and shared config
    from rlstruct.experiment import LayoutConfig, make_batcher   # device layouts
    from rlstruct.evaluation import Evaluator          # evaluation in a worker process
    from rlstruct.episodes import EpisodeTracker       # episode returns, keyed by env_id
    from rlstruct.logger import RunLogger              # the run directory
    from rlstruct.plotting import plot_runs            # returns.png, comparisons
    from rlstruct.nets import mlp                      # orthogonally initialised MLPs
    from rlstruct.optim import adam, gradient_step     # fused Adam; one meaning of clipping
    from rlstruct.sampling import CategoricalSampler, ActorAgent, greedy_info
                                                       # seeded sampling, greedy evaluation,
    from rlstruct.sampling import categorical_log_prob, categorical_entropy  # policy terms
    from rlstruct.learner_group import LearnerGroup    # data-parallel learner ranks
    from rlstruct.learner_rank import RankContext      # what a rank's learn function gets
    from rlstruct.staging import StagingRing           # shards staged onto rank devices

``rlstruct.compat`` keeps rlstructures' names for a port. ``python -m rlstruct plot runs/``
plots run directories (see :mod:`rlstruct.plotting`).
"""
from rlstruct import functional, keys
from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, RestartPolicy, SerialBatcher
from rlstruct.checks import CheckDevice
from rlstruct.dicttensor import DictTensor, masked_dicttensor, masked_tensor
from rlstruct.learner import LearnerThread
from rlstruct.replay import replay_agent, replay_agent_stateless
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
]

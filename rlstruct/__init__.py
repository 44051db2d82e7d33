"""rlstruct: device-aware tensor structures, batchers and device contracts for RL in PyTorch.

The public surface (everything else is internal)::

    from rlstruct import (DictTensor, TemporalDictTensor, Trajectories,
                          masked_tensor, masked_dicttensor,
                          Agent, replay_agent, replay_agent_stateless, CheckDevice,
                          Batcher, SerialBatcher)
    from rlstruct.envs import VecEnv, GymEnv, GymEnvInf, DeviceEnv
    from rlstruct import functional as F
    from rlstruct.errors import RLStructError, ShapeError, DeviceContractError, ...
"""

from rlstruct import functional, keys
from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.checks import CheckDevice
from rlstruct.dicttensor import DictTensor, masked_dicttensor, masked_tensor
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
    "functional",
    "keys",
]

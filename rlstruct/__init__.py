"""rlstruct: device-aware tensor structures, batchers and device contracts for RL in PyTorch."""

from rlstruct.dicttensor import DictTensor, masked_dicttensor, masked_tensor
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories

__version__ = "0.1.0"

__all__ = [
    "DictTensor",
    "TemporalDictTensor",
    "Trajectories",
    "masked_tensor",
    "masked_dicttensor",
]

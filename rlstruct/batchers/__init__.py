"""Batchers: collect trajectories with CPU worker processes or in one process on any device."""

from rlstruct.batchers.multiprocess import Batcher
from rlstruct.batchers.serial import SerialBatcher

__all__ = ["Batcher", "SerialBatcher"]

"""What a run that learns from a :class:`~rlstruct.blocks.replay_buffer.ReplayBuffer` (SAC, DQN)
configures and checks before it starts: the ``checkpoint_buffer`` config field
(:class:`ReplayCheckpoint`) and whether the buffer fits in memory
(:func:`replay_memory_problems`). Both are re-exported by :mod:`rlstruct.blocks.replay_buffer`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ReplayCheckpoint", "replay_memory_problems"]


@dataclass
class ReplayCheckpoint:
    """The config field of the algorithms that learn from a :class:`ReplayBuffer` (SAC, DQN):
    their ``Config`` subclasses it beside ``RunConfig``, and passes the buffer to
    ``run.resume_state`` when it is on."""

    checkpoint_buffer: bool = True
    """save the replay buffer with each checkpoint (checkpoints/buffer.pt), so that --resume
    continues with it; off: a resumed run starts with an empty buffer"""


def replay_memory_problems(buffer_size: int, obs_shape: Sequence[int], obs_itemsize: int,
                           action_numel: int, field: str = "buffer_size") -> list[str]:
    """Whether a replay buffer of ``buffer_size`` transitions fits in this machine's memory:
    ``[]``, or one problem naming ``field``, the bytes it needs and the memory available.

    A transition holds the observation and the next one (``obs_shape`` of ``obs_itemsize``
    bytes each), the action (``action_numel`` numbers, 8 bytes counted each), the reward and
    two flags; the estimate is a lower bound.

    Examples:
        >>> replay_memory_problems(10**6, (3,), 4, 1)
        []
        >>> "buffer_size 1,000,000,000,000 needs" in replay_memory_problems(10**12, (3,), 4, 1)[0]
        True
    """
    import psutil

    per = 2 * math.prod(obs_shape) * obs_itemsize + 8 * action_numel + 4 + 2
    need = buffer_size * per
    available = psutil.virtual_memory().available
    if need <= available:
        return []
    return [f"{field} {buffer_size:,} needs about {need / 2**30:,.1f} GiB for its transitions "
            f"({per} bytes each), but this machine has {available / 2**30:,.1f} GiB available: "
            f"lower --{field.replace('_', '-')}"]

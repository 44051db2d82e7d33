"""SplitMix64 over int64 tensors: the counter-based random streams of the torch-native envs.

Each env of a :class:`~rlstruct.envs.torch.TorchVecEnv` draws its initial states from its own
stream (the rule below). SplitMix64 (Steele, Lea and Flood 2014)
is a counter plus a mixing function, so a stream is one int64 per env, any number of them are
advanced at once with tensor arithmetic, and the numbers are the same on every device. torch has
no uint64 arithmetic: the uint64 bits live in int64 tensors (products wrap mod 2**64, and right
shifts are made logical by masking).

Random initial states (the reproducibility rule): env ``k`` of an env built with ``seed=s`` draws
its initial states from its OWN counter-based stream, SplitMix64 seeded with ``mix64(s + k)``
(``mix64`` is SplitMix64's output function). Reset number ``c`` of env ``k`` (``c = 0`` for its
first reset, counted over ``reset()`` calls and auto-resets alike) takes the outputs
``c * D + 1, ..., c * D + D`` of that stream, where ``D`` is the env's ``n_draws`` and output
``i`` is ``mix64(mix64(s + k) + i * 0x9E3779B97F4A7C15 mod 2**64)``; each output becomes a
uniform ``u`` in ``[0, 1)`` from its top ``m`` bits (``m`` = 24 for float32 states, 53 for
float64: the significand's width), and the initial state is ``low + (high - low) * u`` per
component, like gymnasium's ``np_random.uniform``. The streams are computed with int64 tensor
arithmetic on the env's device: nothing is drawn from torch's global or device generators (a
batcher's agent sampling from them does not shift the envs, and vice versa), the same seed
gives the same initial states on the CPU and on a GPU, and the initial states of env ``k``
depend only on ``s + k`` and on how many times env ``k`` was reset, never on ``N``, on the
other envs, or on how envs are split among batcher workers. So ``CartPole(n_envs=8, seed=0)``
env 5 and ``CartPole(n_envs=1, seed=5)`` env 0 play the same episodes under the same actions.
(A single device generator drawing for all ``N`` envs at once would break this: the draws of
env ``k`` would depend on which other envs reset at the same step.)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["mix64", "splitmix64_uniform", "stream_step"]

# SplitMix64 constants (Steele, Lea and Flood 2014), as signed int64 (torch has no uint64 ops).
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def int64(x: int) -> int:
    """``x`` mod 2**64 as a signed int64 value (two's complement)."""
    x %= 1 << 64
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 ``x`` by ``s`` bits (torch's ``>>`` is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix64(z: Tensor) -> Tensor:
    """SplitMix64's output function over int64 tensors (bits as uint64, products mod 2**64).

    Args:
        z: int64 tensor of any shape.

    Returns:
        int64 tensor of the same shape: a bijective, well-mixed function of each element.
    """
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def splitmix64_uniform(state: Tensor, n: int, dtype: torch.dtype) -> Tensor:
    """The next ``n`` uniforms in ``[0, 1)`` of SplitMix64 generators, one per row (vectorised).

    Row ``r`` is a SplitMix64 generator in state ``state[r]``: its next outputs are
    ``mix64(state[r] + i * 0x9E3779B97F4A7C15)`` for ``i = 1 .. n`` (after which its state is
    ``state[r] + n * 0x9E3779B97F4A7C15``, products mod 2**64). Each output becomes a uniform
    from its top ``m`` bits, ``m`` the significand width of ``dtype`` (24 for float32, 53 for
    float64): exact integer maths, so the same numbers on every device.

    Args:
        state: int64 ``(R,)``, the generators' states.
        n: outputs per row.
        dtype: a floating dtype.

    Returns:
        ``(R, n)`` tensor of ``dtype`` on ``state``'s device.
    """
    steps = torch.arange(1, n + 1, device=state.device) * _GOLDEN  # wraps mod 2**64
    out = mix64(state[:, None] + steps)
    bits = round(-math.log2(torch.finfo(dtype).eps)) + 1  # significand bits, implicit one included
    return _shr(out, 64 - bits).to(dtype) * (2.0**-bits)


def stream_step(n: int) -> int:
    """How far ``n`` outputs move a SplitMix64 state: ``n * 0x9E3779B97F4A7C15`` as an int64."""
    return int64(n * _GOLDEN)


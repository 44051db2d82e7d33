"""Idle OpenMP threads sleep: rlstruct sets ``OMP_WAIT_POLICY=PASSIVE`` unless it is set.

torch's CPU kernels (and MKL's) run on OpenMP threads, as many as ``torch.set_num_threads``
(``--n-threads``). With OpenMP's default wait policy, a thread that has finished its share of a
kernel spins, holding its core, until the next kernel or until its spin count runs out (GNU
OpenMP's: 300,000 turns; ``OMP_WAIT_POLICY=ACTIVE`` spins far longer). Alone on its cores that
costs little; beside any other busy process (the run's own worker processes, another job on a
shared machine, other pytest workers) the spinning threads take the cores from the one thread
they all wait for, and every parallel kernel waits a scheduler time slice for it. With the
passive policy a waiting thread sleeps at once.

Measured on the 2-core machine (docs/guide-performance.md, "Idle threads sleep"): DQN's Atari
learner (2 threads, 64 gradient steps of 32 frames) took 34 s beside a SAC run (niced, but in a
session of its own, which Linux's autogroup scheduling gives an equal share) with the default
policy and 3.4 s with the passive one; alone, 2.1 s with either, with 1.73 cores busy instead of
2.0 (the spinning was the difference). The presets of PPO, SAC, APPO and A2C ran alone as fast
or faster with it; SAC's learn step timed alone is slower (the guide gives the figures).

The policy is read once, when torch loads its OpenMP library, so :func:`prefer_passive` sets
it in the environment before rlstruct imports torch (the package's first lines call it). It
takes effect in every process that imports rlstruct before torch: the command line
(``rlstruct train``, ``python -m rlstruct.algos.NAME``), and the worker processes and learner
ranks, which inherit the environment. A program that imports torch first keeps the policy its
OpenMP started with, while the processes it starts through rlstruct get the passive one. A
value the user set (``OMP_WAIT_POLICY=ACTIVE``) is kept everywhere.
"""

from __future__ import annotations

import os

__all__ = ["WAIT_POLICY", "prefer_passive"]

#: The environment variable OpenMP reads its wait policy from (GNU, LLVM and Intel runtimes).
WAIT_POLICY = "OMP_WAIT_POLICY"


def prefer_passive() -> str:
    """Sets ``OMP_WAIT_POLICY=PASSIVE`` in ``os.environ`` unless it is set already.

    Returns:
        The policy now in the environment (the user's, if they set one).
    """
    return os.environ.setdefault(WAIT_POLICY, "PASSIVE")

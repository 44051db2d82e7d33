"""Idle OpenMP threads sleep: rlstruct sets ``OMP_WAIT_POLICY=PASSIVE`` unless it is set.

torch's CPU kernels (and MKL's) run on OpenMP threads, as many as ``torch.set_num_threads``
(``--n-threads``). With OpenMP's default wait policy, a thread that has finished its share of a
kernel spins, holding its core, until the next kernel or until its spin count runs out (GNU
OpenMP's: 300,000 turns; ``OMP_WAIT_POLICY=ACTIVE`` spins far longer). Alone on its cores that
costs little; beside any other busy process (the run's own worker processes, another job on a
shared machine, other pytest workers) the spinning threads take the cores from the one thread
they all wait for, and every parallel kernel waits a scheduler time slice for it. With the
passive policy a waiting thread sleeps at once.

docs/guide-performance.md ("Idle threads sleep") gives the measurements: the presets of PPO,
SAC, APPO and A2C alone, as fast or faster; beside other busy processes, far faster; SAC's learn
step timed alone on 2 threads, slower.

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

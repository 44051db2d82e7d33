"""Layout autotuner: measure candidate batcher layouts within a time budget and pick the best.

A *layout* is where and how the training batcher collects: a :class:`~rlstruct.SerialBatcher`
(``n_processes=1``, on the CPU or on a GPU) or a :class:`~rlstruct.Batcher` with ``P`` worker
processes, ``n_envs`` envs per process, ``T = n_timesteps`` steps per segment, and ``pipeline``
(1: synchronous; 2: the workers collect the next segment while the learner learns), and the
learner's torch threads ``n_threads`` (a run's ``--n-threads``: searched when the algorithm's
learner is measured, since on a shared machine fewer threads can be faster).

Each candidate is measured by :class:`BatcherMeasure`: build the batcher (constructor and
``reset``: the *start-up*), collect one warm-up batch, then collect whole batches for a given
number of seconds, each followed by the learner and an ``update`` with the model's weights.
The learner is the algorithm's own learn step on the batch when one is given (``learn=``; the
command line and :func:`tune_algo` use the one in the algorithm's :class:`AlgoSetup`), so that
steps/s is the speed of training and a layout that collects faster but trains slower does not
win; otherwise a *fake learner* of ``learn_s`` seconds of sleep (0 by default: pure
collection). A pipelined candidate overlaps collection with the learner. Over the window it
reports steps/s, the cores the process tree kept busy (CPU seconds of this process and all its
descendants, over wall seconds, read by the resource monitor's meter) and steps per
CPU-second.

The search (:func:`search`) is smarter than the exhaustive grid (:func:`grid_search`): a
coordinate search over the axes (workers, envs per process, ``T``, pipeline, learner
threads) starts from the
middle of the grid, measures the neighbours of the current layout along one axis at a time
and moves to the best, until a sweep moves no more; then the best few layouts measured are
measured again in interleaved rounds, and the winner is decided within rounds, so that a load
that changes between rounds on a shared machine does not decide (:func:`paired_winner`).
It spends at most ``budget_s`` seconds (a measurement is only started when the estimate of
its cost still fits). ``benchmarks/tune_vs_grid.py`` compares it with the grid in one run.

Use it from Python (:func:`tune` with your factories, :func:`tune_algo` with the
:class:`AlgoSetup` an algorithm hands over) or from the shell,
``rlstruct tune --algo rlstruct.algos.tuning:ppo --budget 60 --out tune.json``
(:func:`main`).
The JSON file holds :class:`~rlstruct.runs.layout.LayoutConfig`'s fields plus
``n_timesteps``, the learner's ``n_threads``, the env backend measured when not gymnasium's
(and the measurements under ``"tuned"``);
:func:`read_layout`, :func:`layout_from_json` and :func:`apply_layout` read it back.

Changing ``n_envs``, ``n_processes`` or ``T`` changes the batch (``B = P * n_envs`` rows of
``T`` steps), which is a hyperparameter of on-policy algorithms: :func:`tune_algo` and the
command line keep the algorithm's ``P * n_envs * T`` fixed while the layout varies (``T``
follows from ``P`` and ``n_envs``) unless asked otherwise (``keep_batch=False``,
``--vary-batch``); ``batch_size=`` (``--batch-size``) keeps another size. :func:`tune` on its
own keeps a batch only when given ``batch_size=``.

One module per job: :mod:`rlstruct.tools.tune.candidates` (the layouts),
:mod:`rlstruct.tools.tune.searches`
(the searches over any measure), :mod:`rlstruct.tools.tune.measure` (real measurements,
:func:`tune`),
and :mod:`rlstruct.tools.tune.cli` (the command line); the layout files are
:mod:`rlstruct.runs.layout_file`'s.
The library imports no algorithm: an algorithm hands its factories over as an
:class:`AlgoSetup`.
"""

from rlstruct.tools.tune.candidates import AXES as AXES
from rlstruct.tools.tune.candidates import Candidate, candidate_grid, thread_options
from rlstruct.tools.tune.cli import load_setup, main
from rlstruct.tools.tune.measure import AlgoSetup, BatcherMeasure, tune, tune_algo
from rlstruct.tools.tune.searches import OBJECTIVES as OBJECTIVES
from rlstruct.tools.tune.searches import (
    CandidateStats,
    Measurement,
    TuneResult,
    grid_search,
    paired_winner,
    search,
    tuned_layout,
)
from rlstruct.tools.tune.searches import default_probe_s as default_probe_s

__all__ = [
    "Candidate",
    "Measurement",
    "CandidateStats",
    "TuneResult",
    "AlgoSetup",
    "BatcherMeasure",
    "candidate_grid",
    "thread_options",
    "search",
    "grid_search",
    "paired_winner",
    "tune",
    "tune_algo",
    "tuned_layout",
    "load_setup",
    "main",
]

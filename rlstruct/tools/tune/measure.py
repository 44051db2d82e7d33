"""Measuring a candidate for real (:class:`BatcherMeasure`), and :func:`tune`, which measures a
grid of candidates with the search of :mod:`rlstruct.tools.tune.searches`.

The CPU seconds of a measurement are read by the resource monitor's meter
(:meth:`rlstruct.runs.monitor.ResourceMonitor.tree_cpu_s`): this process and every descendant,
reaped children included.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlstruct.agent import Agent
from rlstruct.batchers.make import make_batcher
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.errors import ConfigError
from rlstruct.runs.monitor import ResourceMonitor
from rlstruct.tools.tune.candidates import Candidate, candidate_grid, thread_options
from rlstruct.tools.tune.searches import Measurement, Objective, TuneResult, search
from rlstruct.trajectories import Trajectories

__all__ = ["BatcherMeasure", "AlgoSetup", "tune", "tune_algo"]


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class BatcherMeasure:
    """Measures a candidate for real: builds its batcher with
    :func:`~rlstruct.batchers.make.make_batcher`, collects, closes it (``with``).

    Args:
        create_agent: ``create_agent(**agent_args) -> Agent`` (on the CPU).
        agent_args: keyword arguments of ``create_agent``.
        create_env: ``create_env(**env_args, n_envs=..., seed=s) -> VecEnv``.
        env_args: keyword arguments of ``create_env`` but ``n_envs`` (set per candidate).
        seed: the batchers' seed.
        learn_s: the fake learner's seconds per batch (a sleep after every ``get``); only
            without ``learn``.
        weights: a state_dict handed to ``update`` after every batch (None: no update).
        agent_info: example agent_info of the batchers.
        learn: the algorithm's own learn step, called with every batch (``learn(traj)``, in
            this process, its CPU time counted): steps/s is then the training throughput, so a
            layout that collects faster but trains slower does not win. None: the fake
            learner.
    """

    def __init__(
        self,
        create_agent: Callable[..., Agent],
        agent_args: Mapping[str, Any],
        create_env: Callable[..., VecEnv],
        env_args: Mapping[str, Any],
        *,
        seed: int = 0,
        learn_s: float = 0.0,
        weights: Mapping[str, torch.Tensor] | None = None,
        agent_info: DictTensor | None = None,
        learn: Callable[[Trajectories], Any] | None = None,
    ) -> None:
        if learn_s < 0:
            raise ConfigError(f"learn_s must be >= 0, got {learn_s}")
        if learn is not None and learn_s:
            raise ConfigError(f"give learn (the algorithm's learn step) or learn_s={learn_s} "
                              "(a fake learner), not both")
        self.learn = learn
        self.create_agent, self.agent_args = create_agent, dict(agent_args)
        self.create_env, self.env_args = create_env, dict(env_args)
        self.seed, self.learn_s, self.weights, self.agent_info = seed, learn_s, weights, agent_info
        self._meter: ResourceMonitor | None = None

    def _cpu_s(self) -> float:
        """The process tree's cumulative CPU seconds (the monitor's meter, made on first use)."""
        if self._meter is None:
            self._meter = ResourceMonitor(gpu=False)
        return self._meter.tree_cpu_s()

    def warm_up(self) -> None:
        """Starts the worker processes' forkserver and pays its imports once (a small
        Batcher, without the learner), so that no candidate's start-up includes them."""
        learn, self.learn = self.learn, None
        try:
            self(Candidate(2, 1, 1, 1), 0.0)
        finally:
            self.learn = learn

    def __call__(self, candidate: Candidate, seconds: float) -> Measurement:
        """Measures ``candidate`` over whole batches for at least ``seconds`` (and 2 batches);
        a candidate that raises is reported with its error."""
        t0 = time.perf_counter()
        try:
            return self._measure(candidate, seconds, t0)
        except Exception as err:  # noqa: BLE001 - a failing layout loses, the search goes on
            return Measurement(candidate, 0, 0.0, math.nan, math.nan,
                               time.perf_counter() - t0, f"{type(err).__name__}: {err}")

    def _measure(self, c: Candidate, seconds: float, t0: float) -> Measurement:
        batcher = make_batcher(
            device=c.device, n_processes=c.n_processes, n_timesteps=c.n_timesteps,
            create_agent=self.create_agent, agent_args=self.agent_args,
            create_env=self.create_env, env_args={**self.env_args, "n_envs": c.n_envs},
            seeds=self.seed, agent_info=self.agent_info, pipeline=c.pipeline,
        )
        with batcher, _torch_threads(c.n_threads):
            batcher.reset()
            startup = time.perf_counter() - t0
            pipelined = c.pipeline > 1
            if pipelined:
                batcher.execute()  # starts the stream

            def one_batch() -> int:
                if not pipelined:
                    batcher.execute()
                traj, _ = batcher.get()
                if self.learn is not None:
                    self.learn(traj)
                elif self.learn_s:
                    time.sleep(self.learn_s)
                if self.weights is not None:
                    batcher.update(self.weights)
                return int(traj.lengths.sum())

            one_batch()  # warm-up: the first agent calls, the shared weights' allocation
            cpu0 = self._cpu_s()
            start, steps, n = time.perf_counter(), 0, 0
            while n < 2 or time.perf_counter() - start < seconds:
                steps += one_batch()
                n += 1
            wall = time.perf_counter() - start
            cpu = self._cpu_s() - cpu0
        return Measurement(c, steps, wall, cpu, startup, time.perf_counter() - t0)


# ------------------------------------------------------------------------------ entry points
def tune(
    create_agent: Callable[..., Agent],
    agent_args: Mapping[str, Any],
    create_env: Callable[..., VecEnv],
    env_args: Mapping[str, Any],
    *,
    candidates: Sequence[Candidate] | None = None,
    budget_s: float = 60.0,
    processes: Sequence[int] | None = None,
    n_envs_options: Sequence[int] = (8, 16, 32, 64),
    n_timesteps_options: Sequence[int] = (16, 32, 64),
    pipelines: Sequence[int] = (1, 2),
    devices: Sequence[str] | None = None,
    objective: Objective = "steps_per_s",
    learn_s: float = 0.0,
    weights: Mapping[str, torch.Tensor] | None = None,
    agent_info: DictTensor | None = None,
    seed: int = 0,
    probe_s: float | None = None,
    n_threads_options: Sequence[int] = (1,),
    verbose: bool = True,
    learn: Callable[[Trajectories], Any] | None = None,
    batch_size: int | None = None,
    n_rounds: int = 2,
) -> TuneResult:
    """Measures candidate layouts of a training batcher within ``budget_s`` and picks the best.

    Args:
        create_agent: ``create_agent(**agent_args) -> Agent`` (on the CPU, picklable).
        agent_args: keyword arguments of ``create_agent``.
        create_env: ``create_env(**env_args, n_envs=n, seed=s) -> VecEnv``.
        env_args: keyword arguments of ``create_env`` but ``n_envs`` and ``seed``.
        candidates: the layouts (default: :func:`candidate_grid` of the options below).
        budget_s: seconds the measurements may take (plus a one-off warm-up of about a
            second, and the start-up of the first worker processes of the program).
        processes: worker counts for the grid (1: SerialBatcher).
        n_envs_options: envs per process for the grid.
        n_timesteps_options: ``T`` values for the grid.
        pipelines: pipeline depths for the grid (keep ``(1,)`` for an algorithm that cannot
            learn from a pipelined batcher).
        devices: GPU devices for a SerialBatcher (default: ``cuda:0`` when there is one).
        objective: ``"steps_per_s"`` (default) or ``"steps_per_cpu_s"``.
        learn_s: the fake learner's seconds per batch, the same for every candidate (0: pure
            collection; a pipelined layout overlaps collection with it).
        weights: a state_dict published with ``update`` after each batch, as a training loop
            does (None: no update).
        agent_info: example agent_info of the batchers.
        seed: the batchers' seed.
        probe_s: seconds of a first measurement (default: derived from the budget).
        n_threads_options: torch threads of the learner (this process) to try, an axis of
            the grid (default 1, as the algorithms'); each candidate is measured with its own
            (``Candidate.n_threads``); between measurements this process runs 1.
        verbose: print one line per measurement and the final table.
        learn: the algorithm's learn step, ``learn(traj)`` on every batch, instead of the fake
            learner: steps/s is then what training reaches (see :class:`BatcherMeasure`).
        batch_size: keep ``P * n_envs * T`` at this many steps (see :func:`candidate_grid`).
        n_rounds: interleaved rounds of the finals (see
            :func:`~rlstruct.tools.tune.searches.search`).

    Returns:
        The :class:`TuneResult`; ``write_layout(path, tuned_layout(result))`` saves the pick.
    """
    candidates = _tune_candidates(candidates, processes, n_envs_options, n_timesteps_options,
                                  pipelines, devices, batch_size, n_threads_options)
    measure = BatcherMeasure(create_agent, agent_args, create_env, env_args, seed=seed,
                             learn_s=learn_s, weights=weights, agent_info=agent_info,
                             learn=learn)
    log = print if verbose else None
    with _torch_threads(1):
        if any(c.n_processes > 1 for c in candidates):
            measure.warm_up()
        if verbose:
            _announce(len(candidates), budget_s, objective, learn is not None, learn_s,
                      batch_size)
        result = search(candidates, measure, budget_s=budget_s, objective=objective,
                        probe_s=probe_s, n_rounds=n_rounds, log=log)
    if verbose:
        print(result.table())
    return result


def _tune_candidates(
    candidates: Sequence[Candidate] | None, processes: Sequence[int] | None,
    n_envs_options: Sequence[int], n_timesteps_options: Sequence[int], pipelines: Sequence[int],
    devices: Sequence[str] | None, batch_size: int | None, n_threads_options: Sequence[int],
) -> Sequence[Candidate]:
    """The layouts :func:`tune` measures: ``candidates``, else the :func:`candidate_grid` of the
    options; given candidates keep only those of ``batch_size`` steps when it is given."""
    if candidates is None:
        return candidate_grid(processes, n_envs_options, n_timesteps_options, pipelines,
                              devices, batch_size, n_threads_options)
    if batch_size is not None:
        return [c for c in candidates if c.n_processes * c.n_envs * c.n_timesteps == batch_size]
    return candidates


def _announce(n: int, budget_s: float, objective: str, real_learner: bool, learn_s: float,
              batch_size: int | None) -> None:
    """Prints the line that opens a verbose :func:`tune`."""
    learner = "the algorithm's learner" if real_learner else f"fake learner {learn_s} s per batch"
    batch = f", batch {batch_size} steps" if batch_size is not None else ", the batch varies"
    print(f"tuning {n} candidate layouts in {budget_s:.0f} s "
          f"(objective {objective}, {learner}{batch})")


@dataclass
class AlgoSetup:
    """What an algorithm hands the tuner: its factories, the weights it publishes, its options.

    The library never imports an algorithm; an algorithm (or a module beside it, such as
    ``rlstruct/algos/tuning.py``) builds this and passes it to :func:`tune_algo`, and
    ``rlstruct tune --algo MODULE:FUNCTION`` calls ``FUNCTION(**overrides)`` of the
    module it names to get one.

    Attributes:
        create_agent: ``create_agent(**agent_args) -> Agent`` (on the CPU, picklable).
        agent_args: keyword arguments of ``create_agent``.
        create_env: ``create_env(**env_args, n_envs=n, seed=s) -> VecEnv``.
        env_args: keyword arguments of ``create_env`` but ``n_envs`` and ``seed``.
        weights: the state_dict published with ``update`` after each batch (None: no update).
        agent_info: example agent_info of the batchers (None: none).
        seed: the batchers' seed.
        pipelined: the algorithm learns from a pipelined batcher (False: ``pipeline=1`` only).
        name: the algorithm's name, written into the layout file.
        env_id: the env's id, written into the layout file.
        learn: the algorithm's learn step on one batch (``learn(traj)``, updating the model
            whose ``weights`` are published), measured with every candidate; None: none.
        batch_size: the algorithm's batch, ``P * n_envs * T`` steps, which :func:`tune_algo`
            keeps while the layout varies (unless ``keep_batch=False``); None: the setup has
            none, and ``tune_algo`` then needs ``batch_size=`` or ``keep_batch=False``.
        learner_threads: the learn step's speed depends on torch's threads (its tensor maths
            run in this process), so :func:`tune_algo` searches ``n_threads`` when it measures
            under it; False: 1 thread only.
        env_backend: the run's ``--env-backend`` that ``create_env`` plays, written into the
            layout file ("": none written).
    """

    create_agent: Callable[..., Agent]
    agent_args: Mapping[str, Any]
    create_env: Callable[..., VecEnv]
    env_args: Mapping[str, Any]
    weights: Mapping[str, torch.Tensor] | None = None
    agent_info: DictTensor | None = None
    seed: int = 0
    pipelined: bool = True
    name: str = ""
    env_id: str = ""
    learn: Callable[[Trajectories], Any] | None = None
    batch_size: int | None = None
    learner_threads: bool = True
    env_backend: str = ""


def tune_algo(setup: AlgoSetup, *, budget_s: float = 60.0, use_learner: bool = True,
              keep_batch: bool = True, **options: Any) -> TuneResult:
    """:func:`tune` for what an algorithm hands over: its agent, env, weights, seed, and its
    learn step.

    Args:
        setup: the algorithm's :class:`AlgoSetup` (e.g. ``rlstruct.algos.tuning.ppo(env_id=...)``).
        budget_s: seconds the measurements may take.
        use_learner: measure each layout under the algorithm's learn step (when the setup
            has one); False: collection with the fake learner (``learn_s``).
        keep_batch: keep the algorithm's batch (``setup.batch_size``, or ``batch_size=``)
            while the layout varies (the default: the batch is a hyperparameter of on-policy
            algorithms); False: every ``T`` of the options, the batch varying with the layout.
        **options: keyword arguments of :func:`tune` (``candidates``, ``n_envs_options``,
            ``objective``, ``learn_s``, ``batch_size``, ...); ``pipelines`` defaults to
            ``(1,)`` for an algorithm that cannot learn from a pipelined batcher, and
            ``n_threads_options`` to :func:`~rlstruct.tools.tune.candidates.thread_options`
            (1 up to the usable cores) when the algorithm's learn step is measured and uses
            threads (``setup.learner_threads``), ``(1,)`` otherwise.

    Raises:
        ConfigError: ``setup`` is not an AlgoSetup (an algorithm's name is not enough: the
            library does not import algorithms), ``keep_batch`` without a batch size (the
            setup's or ``batch_size=``), or see
            :func:`tune`.
    """
    if not isinstance(setup, AlgoSetup):
        raise ConfigError(f"tune_algo takes the AlgoSetup an algorithm hands over (e.g. "
                          f"rlstruct.algos.tuning.ppo()), got {setup!r}")
    if keep_batch and options.get("batch_size") is None:
        if setup.batch_size is None:
            raise ConfigError(f"keep_batch=True but the setup of {setup.name or 'the algorithm'}"
                              " has no batch_size: give batch_size= (--batch-size N), or "
                              "keep_batch=False (--vary-batch) to let the batch vary")
        options["batch_size"] = setup.batch_size
    if use_learner and setup.learn is not None and not options.get("learn_s"):
        options.setdefault("learn", setup.learn)
        if setup.learner_threads:
            options.setdefault("n_threads_options", thread_options())
    if not setup.pipelined:
        options.setdefault("pipelines", (1,))
    options.setdefault("seed", setup.seed)
    options.setdefault("weights", setup.weights)
    options.setdefault("agent_info", setup.agent_info)
    return tune(setup.create_agent, setup.agent_args, setup.create_env, setup.env_args,
                budget_s=budget_s, **options)

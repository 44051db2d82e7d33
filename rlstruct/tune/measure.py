"""Measuring a candidate for real (:class:`BatcherMeasure`), and :func:`tune`, which measures a
grid of candidates with the search of :mod:`rlstruct.tune.searches`.

The CPU seconds of a measurement are read by the resource monitor's meter
(:meth:`rlstruct.monitor.ResourceMonitor.tree_cpu_s`): this process and every descendant,
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
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.errors import ConfigError
from rlstruct.experiment import make_batcher
from rlstruct.monitor import ResourceMonitor
from rlstruct.tune.candidates import Candidate, candidate_grid
from rlstruct.tune.searches import Measurement, Objective, TuneResult, search

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
    :func:`~rlstruct.experiment.make_batcher`, collects, closes it (``with``).

    Args:
        create_agent: ``create_agent(**agent_args) -> Agent`` (on the CPU).
        agent_args: keyword arguments of ``create_agent``.
        create_env: ``create_env(**env_args, n_envs=..., seed=s) -> VecEnv``.
        env_args: keyword arguments of ``create_env`` but ``n_envs`` (set per candidate).
        seed: the batchers' seed.
        learn_s: the fake learner's seconds per batch (a sleep after every ``get``).
        weights: a state_dict handed to ``update`` after every batch (None: no update).
        agent_info: example agent_info of the batchers.
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
    ) -> None:
        if learn_s < 0:
            raise ConfigError(f"learn_s must be >= 0, got {learn_s}")
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
        Batcher), so that no candidate's start-up includes them."""
        self(Candidate(2, 1, 1, 1), 0.0)

    def __call__(self, candidate: Candidate, seconds: float) -> Measurement:
        """Measures ``candidate`` over whole batches for at least ``seconds`` (and 2 batches);
        a candidate that raises is reported with its error."""
        t0 = time.perf_counter()
        try:
            return self._measure(candidate, seconds, t0)
        except Exception as err:  # a failing layout (memory, device) loses, the search goes on
            return Measurement(candidate, 0, 0.0, math.nan, math.nan,
                               time.perf_counter() - t0, f"{type(err).__name__}: {err}")

    def _measure(self, c: Candidate, seconds: float, t0: float) -> Measurement:
        batcher = make_batcher(
            device=c.device, n_processes=c.n_processes, n_timesteps=c.n_timesteps,
            create_agent=self.create_agent, agent_args=self.agent_args,
            create_env=self.create_env, env_args={**self.env_args, "n_envs": c.n_envs},
            seeds=self.seed, agent_info=self.agent_info, pipeline=c.pipeline,
        )
        with batcher:
            batcher.reset()
            startup = time.perf_counter() - t0
            pipelined = c.pipeline > 1
            if pipelined:
                batcher.execute()  # starts the stream

            def one_batch() -> int:
                if not pipelined:
                    batcher.execute()
                traj, _ = batcher.get()
                if self.learn_s:
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
    n_threads: int = 1,
    verbose: bool = True,
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
        n_threads: torch threads of this process while measuring (1, as the algorithms').
        verbose: print one line per measurement and the final table.

    Returns:
        The :class:`TuneResult`; ``write_layout(path, result)`` saves the pick.
    """
    if candidates is None:
        candidates = candidate_grid(processes, n_envs_options, n_timesteps_options, pipelines,
                                    devices)
    measure = BatcherMeasure(create_agent, agent_args, create_env, env_args, seed=seed,
                             learn_s=learn_s, weights=weights, agent_info=agent_info)
    log = print if verbose else None
    with _torch_threads(n_threads):
        if any(c.n_processes > 1 for c in candidates):
            measure.warm_up()
        if verbose:
            print(f"tuning {len(candidates)} candidate layouts in {budget_s:.0f} s "
                  f"(objective {objective}, fake learner {learn_s} s per batch)")
        result = search(candidates, measure, budget_s=budget_s, objective=objective,
                        probe_s=probe_s, log=log)
    if verbose:
        print(result.table())
    return result


@dataclass
class AlgoSetup:
    """What an algorithm hands the tuner: its factories, the weights it publishes, its options.

    The library never imports an algorithm; an algorithm (or a module beside it, such as
    ``algos/tuning.py``) builds this and passes it to :func:`tune_algo`, and
    ``python -m rlstruct tune --algo MODULE:FUNCTION`` calls ``FUNCTION(**overrides)`` of the
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


def tune_algo(setup: AlgoSetup, *, budget_s: float = 60.0, **options: Any) -> TuneResult:
    """:func:`tune` for what an algorithm hands over: its agent, env, weights and seed.

    Args:
        setup: the algorithm's :class:`AlgoSetup` (e.g. ``algos.tuning.ppo(env_id=...)``).
        budget_s: seconds the measurements may take.
        **options: keyword arguments of :func:`tune` (``candidates``, ``n_envs_options``,
            ``objective``, ``learn_s``, ...); ``pipelines`` defaults to ``(1,)`` for an
            algorithm that cannot learn from a pipelined batcher.

    Raises:
        ConfigError: ``setup`` is not an AlgoSetup (an algorithm's name is not enough: the
            library does not import algorithms), or see :func:`tune`.
    """
    if not isinstance(setup, AlgoSetup):
        raise ConfigError(f"tune_algo takes the AlgoSetup an algorithm hands over (e.g. "
                          f"algos.tuning.ppo()), got {setup!r}")
    if not setup.pipelined:
        options.setdefault("pipelines", (1,))
    options.setdefault("seed", setup.seed)
    options.setdefault("weights", setup.weights)
    options.setdefault("agent_info", setup.agent_info)
    return tune(setup.create_agent, setup.agent_args, setup.create_env, setup.env_args,
                budget_s=budget_s, **options)

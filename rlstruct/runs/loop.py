"""The loop of a run: :class:`RunLoop`, the half of :class:`~rlstruct.runs.run.Run` that an
algorithm's loop calls each time round: the frame and iteration counters, the stop test,
:meth:`~RunLoop.segments`, :meth:`~RunLoop.publish` and :meth:`~RunLoop.end_iteration`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import gymnasium as gym

from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.dicttensor import DictTensor
from rlstruct.errors import ConfigError
from rlstruct.runs.contention import ContentionWatch
from rlstruct.runs.episodes import EpisodeTracker
from rlstruct.runs.evaluator import Evaluator
from rlstruct.runs.logger import RunLogger
from rlstruct.runs.monitor import ResourceMonitor
from rlstruct.runs.signals import StopSignals
from rlstruct.trajectories import Trajectories

__all__ = ["RunLoop"]


class RunLoop:
    """The counters, the stop test and the loop's steps of a run. :class:`~rlstruct.runs.run.Run`
    is one: it sets the attributes the loop reads (``cfg``, ``algo``, ``action_space``,
    ``start``, ``logger``, ``monitor``, ``signals``) and writes the checkpoints
    (:meth:`checkpoint`).

    Args:
        resumed: the checkpoint the run resumes (``{}``: a fresh run): the counters go on.

    Attributes:
        frames: environment frames recorded so far; ``iteration``: :meth:`end_iteration` calls.
        stopped_by: ``None`` while the run goes on, then ``"target_return"``, ``"max_frames"``,
            ``"time_budget"``, ``"interrupted"`` (Ctrl-C) or ``"loop_end"`` (the loop ended
            before the stop test fired).
        solved_at: ``(frames, seconds)`` when the stop test found the run solved, else None
            (set with ``stopped_by = "target_return"`` only; a resume starts with None).
        eval_return: the mean return of the last finished evaluation (nan before).
        evaluation: the :class:`~rlstruct.runs.evaluator.Evaluator` that :meth:`end_iteration`
            drives (None: no evaluation).
    """

    cfg: Any
    algo: str
    action_space: gym.Space
    start: float
    logger: RunLogger
    monitor: ResourceMonitor
    signals: StopSignals

    def __init__(self, resumed: Mapping[str, Any]) -> None:
        self.frames: int = resumed.get("frames", 0)
        self.iteration: int = resumed.get("iteration", 0)
        self.stopped_by: str | None = None
        self.eval_return: float = resumed.get("eval_return", math.nan)
        # Never taken from the checkpoint: a resumed run is solved when its own stop test
        # finds it so (a solve recorded before would stay beside a later stop by the budget).
        self.solved_at: tuple[int, float] | None = None
        self.evaluation: Evaluator | None = None
        self._tracker = EpisodeTracker()
        self._row_at = -math.inf  # time.monotonic() of the last progress row
        #: the iteration of the last progress row (the run's end writes one where it differs)
        self.row_iteration: int | None = None
        #: the metrics of the last iteration that wrote no row: the run's end row carries them
        self.unlogged_metrics: dict[str, float] = {}
        #: the one-time warning of a run starved of cores (rlstruct.runs.contention); the run
        #: sets the cores its layout asks for
        self.contention = ContentionWatch(None)

    def checkpoint(self) -> None:
        """Saves a checkpoint (:meth:`Run.checkpoint <rlstruct.runs.run.Run.checkpoint>`)."""
        raise NotImplementedError

    def out_of_time(self) -> bool:
        """True once the time budget is spent: one clock read, for learn loops to call between
        minibatches (the run then stops before collecting again)."""
        return time.monotonic() - self.start >= self.cfg.time_budget

    def record(self, traj: Trajectories) -> None:
        """Counts the frames of a collected segment, records the episodes that ended in it
        (``episodes.csv``) and runs the stop test (:attr:`done`)."""
        self.frames += int(traj.lengths.sum())
        returns, lengths = self._tracker(traj)
        self.logger.record_episodes(returns, lengths, frames=self.frames)
        cfg, elapsed = self.cfg, time.monotonic() - self.start
        if (
            cfg.target_return is not None
            and self.logger.episodes >= cfg.target_window
            and self.logger.train_return() >= cfg.target_return
            and not self.evaluation_disagrees()
        ):
            self.stopped_by, self.solved_at = "target_return", (self.frames, elapsed)
        elif self.frames >= cfg.max_frames:
            self.stopped_by = "max_frames"
        elif elapsed >= cfg.time_budget:
            self.stopped_by = "time_budget"

    def segments(
        self, batcher: Batcher | SerialBatcher, agent_info: DictTensor | None = None
    ) -> Iterator[Trajectories]:
        """The segments of an auto-reset batcher, until the stop test fires.

        ``reset(agent_info)`` and ``execute()`` once, then, each time round: ``get()``,
        :meth:`record` and the stop test; yields the segment while the run goes on. The loop body
        learns from it and starts the next segment itself (:meth:`publish`, or ``update`` then
        ``execute``); forgetting to is a ``BatcherStateError`` at the next ``get``.
        """
        batcher.reset(agent_info=agent_info)
        batcher.execute()
        while True:
            if self.iteration and self.out_of_time():  # e.g. a learn phase that ran long
                self.stopped_by = "time_budget"
                return
            with self.monitor.phase("collect"):
                traj, _ = batcher.get()
            self.record(traj)
            if self.done:
                return
            with self.monitor.phase("learn"), self.signals.deferred():
                yield traj  # a signal here waits for the body (up to STOP_GRACE_S)
            if self.signals.requested:
                self.stopped_by = "interrupted"
                return

    def publish(
        self,
        batcher: Batcher | SerialBatcher,
        state_dict: Any,
        agent_info: DictTensor | None = None,
    ) -> None:
        """Hands the new weights to the batcher and starts the next segment: the one place where
        an algorithm publishes its weights.

        ``update(state_dict)``, then ``execute(agent_info)`` for a synchronous batcher; a
        pipelined one (``layout.pipeline >= 2``) is already collecting the next segment, and
        the update lets the segment after it start with these weights.

        Args:
            batcher: the training batcher, after ``get`` (or ``reset``).
            state_dict: the weights (e.g. ``model.state_dict()``, on any device).
            agent_info: new per-row ``agent_info`` (1 or B rows, on the CPU) from this segment on,
                e.g. DQN's epsilon schedule; None keeps the current one.

        Raises:
            ConfigError: ``agent_info`` given to a pipelined batcher, which never calls
                ``execute`` again: pass it to ``segments``/``reset`` instead.
        """
        # SerialBatcher has no ``pipeline`` attribute yet (it is always synchronous).
        synchronous = batcher.pipeline == 1
        if agent_info is not None and not synchronous:
            raise ConfigError(
                f"publish(agent_info=...) needs a synchronous batcher, got "
                f"{type(batcher).__name__} with pipeline={batcher.pipeline}: a pipelined batcher "
                "keeps collecting and never applies a new agent_info; use pipelined=False in "
                "training_batcher, or pass agent_info to reset"
            )
        with self.monitor.phase("collect"):  # a synchronous batcher collects in execute()
            batcher.update(state_dict)
            if synchronous:
                batcher.execute(agent_info=agent_info)

    @property
    def n_actions(self) -> int:
        """The number of actions of a ``Discrete`` action space.

        Raises:
            ConfigError: the action space is not ``Discrete`` (this algorithm needs one).
        """
        if not isinstance(self.action_space, gym.spaces.Discrete):
            raise ConfigError(
                f"{self.algo} needs Discrete actions; {self.cfg.env_id} has {self.action_space}"
                " (ppo, a2c, trpo and sac take Box actions)"
            )
        return int(self.action_space.n)

    def evaluation_disagrees(self) -> bool:
        """True while the latest finished greedy evaluation is below ``target_return``: the
        training return alone then does not stop the run as solved (a lucky window of training
        episodes is not a solved policy). Before any evaluation has finished, and with
        ``eval_every=0``, the training return decides alone."""
        target = self.cfg.target_return
        return (self.evaluation is not None and target is not None
                and math.isfinite(self.eval_return) and self.eval_return < target)

    @property
    def done(self) -> bool:
        """True once the stop test (target return, frame or time budget) has fired."""
        return self.stopped_by is not None

    def end_iteration(self, weights: Any, **metrics: float) -> None:
        """Ends an iteration: picks up a finished evaluation, starts one every ``eval_every``
        iterations with ``weights`` (e.g. ``model.state_dict()``, or a function that returns
        them, called only then: SAC ends an iteration per frame), writes the progress row
        (``eval_return`` only when an evaluation finished, nan otherwise) and saves a
        checkpoint every ``checkpoint_every`` iterations.

        A row is written at most every ``progress_every_s`` seconds (SAC ends an iteration per
        frame): an iteration that ends sooner writes none, unless it is the first, brings an
        evaluation's result or saves a checkpoint; the next row counts its frames, and the
        monitor's columns cover every iteration since the previous row (the run's end row
        carries the metrics of its last iteration).

        Raises:
            RunFolderError: the run folder was removed while the run was going on.
        """
        self.logger.folder.require("progress.csv")
        self.iteration += 1
        eval_return = math.nan
        if self.evaluation is not None:
            result = self.evaluation.poll()
            if result is not None:
                eval_return = self.eval_return = result
            if self.iteration % self.cfg.eval_every == 0:
                self.evaluation.start(weights() if callable(weights) else weights)
        checkpoint = self.iteration % self.cfg.checkpoint_every == 0
        now = time.monotonic()
        if (checkpoint or not math.isnan(eval_return) or self.row_iteration is None
                or now - self._row_at >= self.cfg.progress_every_s):
            metrics = {**metrics, **self.monitor.sample(self.frames)}
            row = self.logger.log(self.frames, iteration=self.iteration,
                                  eval_return=eval_return, **metrics)
            warning = self.contention.update(row)
            if warning is not None:
                self.logger.warn(warning)
            self._row_at, self.row_iteration, self.unlogged_metrics = now, self.iteration, {}
        else:
            self.unlogged_metrics = metrics
        if checkpoint:
            self.checkpoint()

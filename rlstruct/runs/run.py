"""The run scaffold: what every training script repeats, written once.

:class:`Run` (a context manager) sets up and tears down one run from a
:class:`~rlstruct.runs.config.RunConfig` (re-exported here) that
:func:`~rlstruct.runs.resolve.resolve` checked once: threads and seed, the learner device, the
training batcher, the :class:`~rlstruct.runs.evaluator.Evaluator`, the
:class:`~rlstruct.runs.logger.RunLogger`, checkpoints (and ``--resume`` from them), the stop test
(:class:`~rlstruct.runs.loop.RunLoop`), the summary and ``summary.json``. Everything is closed on
the way out, on Ctrl-C and SIGTERM too: a first signal ends the run with a final checkpoint that
matches the summary and raises :class:`~rlstruct.runs.signals.Terminated`
(:mod:`rlstruct.runs.signals`).

A training loop with it (see ``rlstruct/algos/`` for eight complete ones)::

    with Run("ppo", cfg) as run:  # resolves the config first (rlstruct.runs.resolve)
        cfg = run.cfg  # the resolved config (a layout file applied, --resume auto picked)
        model = run.model(make_model)  # the call checkpoints record
        batcher = run.training_batcher(MyAgent, {"model": model}, GymEnvInf, cfg.n_timesteps)
        run.evaluator(MyAgent, {"model": model}, GREEDY)   # greedy episodes beside training
        group = run.learner_group(make_model, model, partial(adam, lr=cfg.lr), learn, MyAgent)
        for traj in run.segments(batcher):  # reset, then get() and record until the stop test
            stats = group.learn(traj)  # on the learner device (or on N learner ranks)
            run.publish(batcher, group.state_dict())  # the weights, then the next segment
            run.end_iteration(group.state_dict(), **stats)  # evaluation, row, checkpoint
    summary = run.summary
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import torch

from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.batchers.deadlines import worker_waits
from rlstruct.batchers.make import make_batcher
from rlstruct.blocks.multi_input import model_factory
from rlstruct.checks import CheckDevice
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.envs.registry import ATARI_BACKENDS, env_dims, env_shape, env_spaces
from rlstruct.errors import ConfigError
from rlstruct.learners.base import LearnerGroupBase, OptimizerFactory
from rlstruct.learners.torchrun import serve_rank
from rlstruct.runs import checkpoint as ckpt
from rlstruct.runs.config import RunConfig, code_dir, config_to_dict, session_record
from rlstruct.runs.contention import ContentionWatch, asked_cores
from rlstruct.runs.contents import CheckpointContents
from rlstruct.runs.evaluator import Evaluator
from rlstruct.runs.groups import learner_group
from rlstruct.runs.lock import FolderGuard, removes_folder
from rlstruct.runs.logger import RunLogger
from rlstruct.runs.loop import RunLoop
from rlstruct.runs.monitor import ResourceMonitor
from rlstruct.runs.outcome import RunRecord, describe, run_summary, write_summary
from rlstruct.runs.resolve import Resolved, resolve
from rlstruct.runs.signals import StopSignals, Terminated, final_checkpoint, lost_rank
from rlstruct.runs.tracking import tracking_options
from rlstruct.runs.training_env import training_env

__all__ = ["Run", "Terminated", "env_dims", "env_shape", "env_spaces"]  # RunConfig: config.py

T = TypeVar("T")


class Run(RunLoop):
    """One training run (see the module docstring); use it as a context manager.

    Construction resolves the config (:func:`~rlstruct.runs.resolve.resolve`; a
    :class:`~rlstruct.runs.resolve.Resolved` is taken as it is), sets ``torch`` threads and
    seed and creates the run directory. The clock (``wall_time``, ``time_to_solve``, the time
    budget) starts here, so worker start-up counts.

    Args:
        algo: the algorithm's name (run directory, summary).
        cfg: the run's config, or what :func:`~rlstruct.runs.resolve.resolve` made of it.

    Attributes:
        resolved: the :class:`~rlstruct.runs.resolve.Resolved` the run started from.
        cfg: the resolved config (saved whole in ``config.json`` and in every checkpoint).
        device: the learner device. ``world_size``: torchrun's (1: not under torchrun).
        obs_shape: the observation's shape (``(4, 84, 84)`` for Atari); ``obs_dim``: its size.
            For a Dict observation, ``(F,)``: the features of its multi-input encoder.
        obs_spec: the feature keys of a Dict observation
            (:func:`~rlstruct.blocks.multi_input.obs_spec`), or None; what
            :func:`~rlstruct.blocks.multi_input.model_factory` takes.
        action_space: the single-env action space (``Discrete``, ``Box``...), for the policy
            head (:func:`rlstruct.blocks.distributions.make_head`).
        logger: the :class:`~rlstruct.runs.logger.RunLogger` (``logger.folder``: every path).
        batcher: the training batcher (None before :meth:`training_batcher`).
        frames, iteration, stopped_by, solved_at, eval_return, evaluation: the loop's
            counters and stop test (:class:`~rlstruct.runs.loop.RunLoop`).
        n_resumes: how many times this run was resumed (0: a fresh run).
        contents: what checkpoints hold (:class:`~rlstruct.runs.contents.CheckpointContents`).
        launch: how the run was launched, and its learner ranks (config.json, summary.json).
        monitor, signals: per iteration, seconds collecting/learning/waiting, cores, memory,
            GPU use; the :class:`~rlstruct.runs.signals.StopSignals` of SIGTERM and Ctrl-C.
        summary: the outcome, set on exit (see :meth:`__exit__`).
    """

    def __init__(self, algo: str, cfg: RunConfig | Resolved[Any]) -> None:
        self.algo, self.start = algo, time.monotonic()
        self.resolved = resolve(cfg, algo)  # every problem of the config, before anything starts
        if self.resolved.rank > 0:  # torchrun: ranks > 0 only learn (rlstruct/learners/torchrun.py)
            serve_rank(self.resolved.learner_device.type)  # exits the process
        cfg = self.cfg = self.resolved.cfg
        torch.set_num_threads(cfg.n_threads)
        torch.manual_seed(cfg.seed)
        self.device, self.world_size = self.resolved.learner_device, self.resolved.world_size
        self.obs_shape, self.action_space = self.resolved.obs_shape, self.resolved.action_space
        self.obs_spec = self.resolved.obs_spec
        self.obs_dim = math.prod(self.obs_shape)
        r = self.resolved.checkpoint or {}
        super().__init__(r)  # the counters (rlstruct.runs.loop)
        self.contention = ContentionWatch(asked_cores(
            cfg.layout, cfg.n_threads, self.device.type == "cpu"), n_threads=cfg.n_threads)
        self.start -= r.get("wall_time", 0.0)  # the clock and the time budget go on
        self._resumed_at = self.iteration
        self.n_resumes: int = r.get("resumes", -1) + 1
        self.summary: dict[str, Any] = {}
        self.contents = CheckpointContents(r, cfg.resume)  # what checkpoints hold
        self.batcher: Batcher | SerialBatcher | None = None
        self._groups: list[Any] = []  # a stop collects their batch in flight first
        self._stack = contextlib.ExitStack()
        self.launch: dict[str, Any] = self.resolved.launch
        self._guard = FolderGuard(cfg.resume)  # one session per folder (rlstruct.runs.lock)
        try:
            self.logger = RunLogger(
                algo, cfg.env_id, cfg, cfg.runs_dir, total_frames=cfg.max_frames,
                time_budget=cfg.time_budget, window=cfg.target_window, code_dir=code_dir(cfg),
                resume_dir=cfg.resume, resume_frames=self.frames,
                resume_wall_time=r.get("wall_time", 0.0), best_score=r.get("best_score"),
                launch=self.launch, session=session_record(cfg, self.frames, self.launch),
                tracking=tracking_options(algo, cfg))
        except BaseException:
            self._guard.close(failed_early=True)
            raise
        self._guard.adopt(self.logger.dir)
        self.monitor = ResourceMonitor()
        self._stack.callback(self.monitor.close)
        # What checkpoints/latest.pt holds: its frames and iteration (summary.json).
        self._checkpointed = {"frames": self.frames, "iteration": self.iteration} if r else None
        # After a stop signal: a torchrun rank's death that caused it, a failed final
        # checkpoint, an error that followed it (summary.json says each).
        self._cause = self._checkpoint_error = self._after_signal = None
        self.signals = StopSignals(self.logger.checkpoints.remove_partial,
                                   torchrun=self.world_size > 1)

    # ------------------------------------------------------------------ set-up
    def training_batcher(
        self, create_agent: Callable[..., Agent], agent_args: dict[str, Any],
        create_env: Callable[..., VecEnv], n_timesteps: int, agent_info: DictTensor | None = None,
        pipelined: bool = True,
    ) -> Batcher | SerialBatcher:
        """The training batcher of the layout (:func:`~rlstruct.batchers.make.make_batcher` on
        the resolved batcher device, the envs of :func:`~rlstruct.runs.training_env.training_env`,
        seeded with ``seed``); closed with the run; on a resume its models hold the checkpoint's
        weights first. ``pipelined``: the algorithm's loop works with a pipelined batcher
        (False: episodic collection, or an ``agent_info`` that changes every segment).

        Raises:
            ConfigError: ``layout.pipeline > 1`` for an algorithm that does not support it.
            CheckpointError: a resumed model's saved state does not load into it.
        """
        layout = self.cfg.layout
        create_env, env_args = training_env(self.algo, self.cfg, create_env,
                                            self.resolved.batcher_device)
        if layout.pipeline > 1 and not pipelined:
            raise ConfigError(
                f"{self.algo} collects synchronously; --pipeline {layout.pipeline} is for "
                "algorithms that learn from one segment while the next is collected (ppo, a2c)")
        self.contents.eval_agent = (self.contents.eval_agent
                                    or (create_agent, dict(agent_args), None))
        self.contents.load_agent_models(agent_args)  # a resume collects with its weights
        batcher = make_batcher(
            device=self.resolved.batcher_device, n_processes=layout.n_processes,
            n_timesteps=n_timesteps, create_agent=create_agent, agent_args=agent_args,
            create_env=create_env, env_args=env_args,
            seeds=self.cfg.seed + 10_007 * self.n_resumes,  # fresh env seeds after a resume
            agent_info=agent_info, check_devices=layout.check_devices,
            pipeline=layout.pipeline, backend=layout.backend, ray_address=layout.ray_address,
            **layout.batcher_options(),  # --max-restarts, the Ray actors' resources
            **self.worker_waits(),  # --worker-timeout, and the time budget's end
        )
        self.batcher = batcher  # Run.learner_group publishes into it
        if hasattr(batcher, "external_cpu_seconds"):  # workers outside this tree (Ray actors)
            self.monitor.watch(batcher)
        return self.enter(batcher)

    def worker_waits(self) -> dict[str, Any]:
        """How long the training batcher's workers may stay silent (:func:`worker_waits`)."""
        return worker_waits(self.cfg.worker_timeout, self.start, self.cfg.time_budget)

    def evaluator(self, create_agent: Callable[..., Agent], agent_args: dict[str, Any],
                  agent_info: DictTensor | None = None) -> Evaluator | None:
        """Sets up the :class:`~rlstruct.runs.evaluator.Evaluator` (``eval_envs`` episodes on
        ``eval_device``, seed ``seed + 1000``) that :meth:`end_iteration` drives; ``None`` when
        ``eval_every`` is 0. Call it while the model is still on the CPU."""
        self.contents.eval_agent = (create_agent, dict(agent_args), agent_info)
        if self.cfg.eval_every == 0 or self.cfg.env_backend in ATARI_BACKENDS:
            return None  # Atari: an evaluation episode is thousands of 4x84x84 frames
        self.evaluation = self.enter(Evaluator(
            create_agent, agent_args, self.cfg.env_id, self.cfg.eval_envs,
            seed=self.cfg.seed + 1000, device=self.resolved.eval_device, agent_info=agent_info,
            check_devices=self.cfg.layout.check_devices, env_modules=self.resolved.env_modules))
        return self.evaluation

    def model(self, cls: Callable[..., torch.nn.Module], *args: Any, **kwargs: Any) -> Any:
        """``cls(*args, **kwargs)``, the call recorded in the checkpoints (``constructors``) so
        that ``rlstruct evaluate`` rebuilds the model without the algorithm's code: plain
        values (numbers, strings, lists, dicts); ``cls`` may be a ``functools.partial``."""
        return self.contents.model(cls, *args, **kwargs)

    def factory(self, make: Callable[..., torch.nn.Module], *args: Any,
                **kwargs: Any) -> Callable[..., torch.nn.Module]:
        """The picklable factory of the algorithm's network ``make(*args, **kwargs)``, sized by
        :attr:`obs_shape`/``obs_dim``; behind a multi-input encoder for a Dict observation
        (:func:`~rlstruct.blocks.multi_input.model_factory`). Give it to :meth:`model`."""
        return model_factory(self.obs_spec, make, *args, **kwargs)

    def learner(self, agent: Agent) -> Agent:
        """``agent`` moved to the learner device, wrapped in CheckDevice with ``check_devices``."""
        agent.to(self.device)
        return CheckDevice(agent, self.device) if self.cfg.layout.check_devices else agent

    def learner_group(
        self, make_model: Callable[[], torch.nn.Module], model: torch.nn.Module,
        make_optimizer: OptimizerFactory, learn: Callable[..., Any],
        make_agent: Callable[[torch.nn.Module], Agent] | None = None,
        per_rank: tuple[str, ...] = (), stacked: bool = False, policy: str = "",
    ) -> LearnerGroupBase:
        """The learner group the algorithm learns with, closed with the run: its ranks run
        ``learn(agent, optimizer, batch, cfg, step)`` on their rows of each batch, starting from
        ``model``'s weights (each layout's group and the arguments:
        :func:`rlstruct.runs.groups.learner_group`)."""
        return learner_group(self, make_model, model, make_optimizer, learn, make_agent,
                             per_rank, stacked, policy)

    def register_group(self, group: LearnerGroupBase, stands_for: torch.nn.Module,
                       **objects: Any) -> None:
        """Registers a learner group: a stop collects its batch in flight before the final
        checkpoint, the checkpoints hold ``objects`` (:meth:`checkpoint_state`) and record how
        to rebuild ``stands_for``, the module whose weights the group's ``model`` state is."""
        self._groups.append(group)
        self.contents.stand_for("model", stands_for)
        self.checkpoint_state(**objects)

    def enter(self, context: contextlib.AbstractContextManager[T]) -> T:
        """Enters ``context`` (a batcher, a learner group) and closes it with the run."""
        return self._stack.enter_context(context)

    def checkpoint_state(self, **objects: Any) -> None:
        """What checkpoints hold: ``name -> obj.state_dict()`` for each object given (model,
        optimizer, ...), plus the config, the counters, the RNG states and the clock (see
        :meth:`checkpoint`). A resumed run (``--resume``) loads them here, RNG states included.

        Raises:
            CheckpointError: the checkpoint being resumed holds no state for one of them, or a
                state that does not load into it.
        """
        self.contents.add(**objects)

    def resume_state(self, **objects: Any) -> None:
        """States that only a resume needs, too large for ``best.pt`` (a replay buffer): saved to
        ``checkpoints/<name>.pt`` with every checkpoint and loaded on ``--resume``.

        Raises:
            CheckpointError: the saved state does not load into the object.
        """
        self.contents.add_resume_files(self.logger.folder, **objects)

    def checkpoint(self) -> None:
        """Saves ``checkpoints/latest.pt`` (and ``best.pt`` by the train return): the
        :attr:`contents`, ``algo``, the whole ``config``, ``frames``, ``iteration``,
        ``episodes``, ``resumes``, ``wall_time``, ``eval_return``, ``solved_at``,
        ``best_score`` and the ``rng`` states.

        Raises:
            CheckpointError: the write failed (e.g. a full disk; the last good one is kept).
        """
        state = self.contents.state()
        state.update(
            algo=self.algo, config=config_to_dict(self.cfg), frames=self.frames,
            iteration=self.iteration, episodes=self.logger.episodes, resumes=self.n_resumes,
            wall_time=time.monotonic() - self.start, eval_return=self.eval_return,
            solved_at=None if self.solved_at is None else list(self.solved_at),
            best_score=self.logger.best_score, rng=ckpt.rng_state())
        self.logger.checkpoints.save(state, self.logger.train_return(),  # resume files first
                                     self.contents.resume_files, self.iteration)
        self._checkpointed = {"frames": self.frames, "iteration": self.iteration}

    def outcome_record(self) -> RunRecord:
        """What the run knows of itself now, for :func:`~rlstruct.runs.outcome.run_summary`."""
        logger = self.logger
        return RunRecord(
            algo=self.algo, run_dir=str(logger.dir), stopped_by=self.stopped_by,
            solved_at=self.solved_at, frames=self.frames, iterations=self.iteration,
            episodes=logger.episodes, train_column=logger.train_column,
            train_return=logger.train_return(), eval_return=self.eval_return,
            wall_time=time.monotonic() - self.start, resumes=self.n_resumes, launch=self.launch,
            checkpoint=self._checkpointed, ray_nodes=tuple(getattr(self.batcher, "nodes", ())),
            stop=f"Terminated: {self.signals.stop_now()}" if self.signals.requested else None,
            after_signal=self._after_signal, cause=self._cause,
            checkpoint_error=self._checkpoint_error)

    # ------------------------------------------------------------------ teardown
    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Writes the last progress row and checkpoint (also on Ctrl-C and SIGTERM; none where
        they stopped it before its first iteration ended), closes the batchers, the evaluator
        and the logger (which plots), then sets, prints and writes :attr:`summary`
        (``summary.json``; status ``failed`` and the error after any other exception, unless the
        run failed before its first iteration: :class:`~rlstruct.runs.lock.FolderGuard`, which
        removes a fresh folder that a typed error ended before its first iteration). A run
        stopped by a signal first collects the batch its learner group learns on, so the
        checkpoint's frames are the summary's, then raises
        :class:`~rlstruct.runs.signals.Terminated` (:mod:`rlstruct.runs.signals`)."""
        end = self.signals.ending(exc, self.stopped_by)
        self._after_signal = end.after_signal
        # what summary.json records: the signal, also where a library replaced its Terminated
        recorded = (self.signals.stop_now() if end.by_signal
                    and isinstance(exc, KeyboardInterrupt) else exc)
        try:
            if end.finish:
                if self.stopped_by is None:  # Ctrl-C, or a loop that ended on its own
                    self.stopped_by = "interrupted" if end.raised or end.by_signal else "loop_end"
                if end.by_signal:
                    self._cause = lost_rank(self._groups)
                if (self.logger.n_rows == 0 or self.logger.frames != self.frames
                        or self.row_iteration not in (None, self.iteration)):
                    self.logger.log(self.frames, iteration=self.iteration, eval_return=math.nan,
                                    **self.unlogged_metrics, **self.monitor.sample(self.frames))
                # A stop before the first iteration may come before the algorithm registered all
                # its state: no checkpoint then (--resume auto starts such a run afresh).
                if self.iteration > self._resumed_at or self.stopped_by != "interrupted":
                    self._checkpoint_error = final_checkpoint(self.checkpoint, self._groups,
                                                              end.by_signal or end.raised)
        finally:
            try:
                self._stack.close()
            finally:
                try:
                    self.logger.close()
                finally:
                    self.signals.restore()
                    self._write_summary(end.finish, recorded)
                    self._guard.close(not end.finish and self.iteration == self._resumed_at,
                                      removes_folder(exc))
        if end.finish:
            print(describe(self.algo, self.summary, self.logger.train_column))
            print(f"outputs in {self.logger.dir}", flush=True)
        if end.by_signal and not isinstance(exc, Terminated):  # none, or one it stands for
            raise self.signals.stop_now() from None

    def _write_summary(self, finish: bool, exc: BaseException | None) -> None:
        """Sets :attr:`summary` (when the run finished) and writes ``summary.json``."""
        summary = run_summary(self.outcome_record(), finish, exc)
        if finish:
            self.summary = summary
        write_summary(self.logger, summary)

"""The run scaffold: what every training script repeats, written once.

- :class:`RunConfig`: the config fields every algorithm shares (environment, seed, budgets,
  stop test, evaluation cadence, checkpoints, outputs, threads, the shared hyperparameters
  ``n_timesteps``, ``hidden``, ``lr``, ``gamma``, ``max_grad_norm``, resume) and the nested
  device layout (:class:`~rlstruct.runs.layout.LayoutConfig`). An algorithm's ``Config``
  subclasses it; ``tyro`` turns it into a command line whose ``--help`` is the fields'
  docstrings, and :meth:`RunConfig.problems` lists every bad value before anything starts.
- :class:`Run`: a context manager that sets up and tears down one run: threads and seed, the
  learner device, the training batcher, the :class:`~rlstruct.runs.evaluator.Evaluator`, the
  :class:`~rlstruct.runs.logger.RunLogger`, checkpoints (and ``--resume`` from them), the stop test,
  the summary and ``summary.json``. Everything is closed on the way out, on Ctrl-C and SIGTERM
  too: a first signal ends the run with a final checkpoint that matches the summary and raises
  :class:`~rlstruct.runs.signals.Terminated` (see :mod:`rlstruct.runs.signals`).

A training loop with it (see ``rlstruct/algos/`` for eight complete ones)::

    with Run("ppo", cfg) as run:  # resolves the config first (rlstruct.runs.resolve)
        model = run.model(make_model)  # the call checkpoints record
        batcher = run.training_batcher(MyAgent, {"model": model}, GymEnvInf, cfg.n_timesteps)
        run.evaluator(MyAgent, {"model": model}, GREEDY)   # greedy episodes beside training
        group = run.learner_group(make_model, model, partial(adam, lr=cfg.lr), learn, MyAgent)
        for traj in run.segments(batcher):  # reset, then get() and record until the stop test
            stats = group.learn(traj)  # on the learner device (or on N learner ranks)
            run.publish(batcher, group.state_dict())  # the weights, then the next segment
            run.end_iteration(group.state_dict(), **stats)  # evaluation, row, checkpoint
    summary = run.summary

The stop test and every output read ONE training return: the mean of the last
``target_window`` finished episodes (``train_return_mean<N>`` in progress.csv and the summary).
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import gymnasium as gym
import torch

from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.batchers.make import make_batcher
from rlstruct.checks import CheckDevice
from rlstruct.devices import resolve_device
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.envs.gym import GymEnvInf
from rlstruct.envs.registry import EnvModules, env_dims, env_shape, env_spaces
from rlstruct.envs.torch import make_torch_env
from rlstruct.errors import CheckpointError, ConfigError, LearnerError
from rlstruct.learners.base import LearnerGroupBase, OptimizerFactory
from rlstruct.learners.torchrun import serve_rank, torchrun_rank, torchrun_world
from rlstruct.runs import checkpoint as ckpt
from rlstruct.runs.config import RunConfig
from rlstruct.runs.episodes import EpisodeTracker
from rlstruct.runs.evaluator import Evaluator
from rlstruct.runs.lock import FolderGuard
from rlstruct.runs.logger import RunLogger, config_to_dict
from rlstruct.runs.monitor import ResourceMonitor
from rlstruct.runs.outcome import describe, run_summary
from rlstruct.runs.resolve import resolve
from rlstruct.runs.signals import StopSignals, Terminated, final_checkpoint, lost_rank
from rlstruct.trajectories import Trajectories

__all__ = ["Run", "Terminated", "env_dims", "env_shape", "env_spaces"]  # RunConfig: config.py

class Run:
    """One training run (see the module docstring); use it as a context manager.

    Construction sets ``torch`` threads and seed, resolves the learner device, probes the env
    and creates the run directory. The clock (``wall_time``, ``time_to_solve``, the time budget)
    starts here, so worker start-up counts.

    Args:
        algo: the algorithm's name (run directory, summary).
        cfg: the run's config; saved whole in ``config.json`` and in every checkpoint.

    Attributes:
        cfg: the config.
        device: the learner device.
        obs_shape: the observation's shape (``(4, 84, 84)`` for Atari); ``obs_dim``: its
            flattened size.
        action_space: the single-env action space (``Discrete``, ``Box``...); pick the policy
            head from it (:func:`rlstruct.blocks.distributions.make_head`).
        logger: the :class:`~rlstruct.runs.logger.RunLogger`.
        frames: environment frames recorded so far; ``iteration``: :meth:`end_iteration` calls.
        stopped_by: ``None`` while the run goes on, then ``"target_return"``, ``"max_frames"``,
            ``"time_budget"``, ``"interrupted"`` (Ctrl-C) or ``"loop_end"`` (the loop ended
            before the stop test fired).
        eval_return: the mean return of the last finished evaluation (nan before).
        summary: the outcome, set on exit (see :meth:`__exit__`).
    """

    def __init__(self, algo: str, cfg: RunConfig) -> None:
        if torchrun_rank() > 0:  # torchrun: ranks > 0 only learn (rlstruct/learners/torchrun.py)
            serve_rank(resolve_device(cfg.layout.learner_device).type)  # exits the process
        self.start = time.monotonic()
        cfg = resolve(cfg, algo)  # every problem of the config, before anything starts
        self.algo, self.cfg = algo, cfg
        torch.set_num_threads(cfg.n_threads)
        torch.manual_seed(cfg.seed)
        self.device = resolve_device(cfg.layout.learner_device)
        self.obs_shape, self.action_space = env_spaces(cfg.env_id, cfg.env_backend)
        self.obs_dim = math.prod(self.obs_shape)
        self._resumed: dict[str, Any] = {}
        if cfg.resume is not None:
            # resolve() checked that it loads, is this algorithm's and fits the config
            self._resumed = ckpt.load_checkpoint(Path(cfg.resume) / "checkpoints" / "latest.pt")
        r = self._resumed
        self.start -= r.get("wall_time", 0.0)  # the clock and the time budget go on
        self.frames, self.iteration = r.get("frames", 0), r.get("iteration", 0)
        #: How many times this run was resumed (0: a fresh run).
        self.n_resumes: int = r.get("resumes", -1) + 1
        self.stopped_by: str | None = None
        self.eval_return = r.get("eval_return", math.nan)
        self.summary: dict[str, Any] = {}
        self._solved_at = None if r.get("solved_at") is None else tuple(r["solved_at"])
        self._tracker = EpisodeTracker()
        self._evaluator: Evaluator | None = None
        self._saved: dict[str, Any] = {}
        self._resume_only: dict[str, Any] = {}  # checkpoints/<name>.pt (resume_state)
        #: name -> the module a saved object stands for (a learner group for the model it
        #: replicates): how the checkpoint's constructors and evaluation agent find it.
        self._stands_for: dict[str, Any] = {}
        self._constructors: list[tuple[Any, dict[str, Any]]] = []
        self._eval_agent: tuple[Any, dict[str, Any], DictTensor | None] | None = None
        self._training_batcher: Any = None
        self._stack = contextlib.ExitStack()
        world = torchrun_world()
        #: How the run was launched, and its learner ranks (config.json, summary.json).
        self.launch: dict[str, Any] = (
            {"launcher": "torchrun", "world_size": world} if world > 1 else
            {"launcher": "rlstruct", "world_size": cfg.layout.n_learners,
             "learner_backend": cfg.layout.learner_backend})
        # One session per folder; a run that fails before its first iteration leaves the
        # folder as it was (rlstruct/runs/lock.py).
        self._guard = FolderGuard(cfg.resume)
        try:
            self.logger = RunLogger(
                algo, cfg.env_id, cfg, cfg.runs_dir, total_frames=cfg.max_frames,
                window=cfg.target_window, code_dir=_code_dir(cfg),
                resume_dir=cfg.resume, resume_frames=self.frames,
                resume_wall_time=r.get("wall_time", 0.0), best_score=r.get("best_score"),
                launch=self.launch,
            )
        except BaseException:
            self._guard.close(failed_early=True)
            raise
        self._guard.adopt(self.logger.dir)
        self._resumed_at = self.iteration
        #: Per iteration: seconds collecting/learning/waiting, cores busy, memory, GPU use.
        self.monitor = ResourceMonitor()
        self._stack.callback(self.monitor.close)
        #: The learner groups (a stop collects a batch they still learn on before the checkpoint).
        self._groups: list[Any] = []
        #: What ``checkpoints/latest.pt`` holds: its frames and iteration (summary.json).
        self._checkpointed: dict[str, int] | None = (
            {"frames": self.frames, "iteration": self.iteration} if r else None)
        self._cause: str | None = None  # a failure found after a signal (a torchrun rank died)
        self._checkpoint_error: str | None = None
        self._after_signal: str | None = None  # an error that followed the stop signal
        self.signals = StopSignals(self._remove_partial_files, torchrun=world > 1)

    # ------------------------------------------------------------------ set-up
    def training_batcher(
        self,
        create_agent: Callable[..., Agent],
        agent_args: dict[str, Any],
        create_env: Callable[..., VecEnv],
        n_timesteps: int,
        agent_info: DictTensor | None = None,
        pipelined: bool = True,
    ) -> Batcher | SerialBatcher:
        """The training batcher of the layout (:func:`~rlstruct.batchers.make.make_batcher`):
        ``n_envs`` envs ``create_env(env=env_id, n_envs=...)`` per process, seeded with
        ``seed``; closed with the run.

        Args:
            pipelined: the algorithm's loop works with a pipelined batcher (``--pipeline``);
                False refuses ``layout.pipeline > 1`` (e.g. episodic collection, or an
                ``agent_info`` that changes every segment).

        Raises:
            ConfigError: ``layout.pipeline > 1`` for an algorithm that does not support it.
        """
        layout = self.cfg.layout
        env_args: dict[str, Any] = {"env": self.cfg.env_id, "n_envs": layout.n_envs}

        if self.cfg.env_backend != "gymnasium":
            if create_env is not GymEnvInf:
                raise ConfigError(
                    f"{self.algo} collects with {getattr(create_env, '__name__', create_env)}; "
                    f"--env-backend {self.cfg.env_backend} replaces auto-reset gymnasium envs "
                    "(GymEnvInf) only"
                )
            if self.cfg.env_backend == "torch":
                create_env = make_torch_env
                env_args["device"] = str(resolve_device(layout.batcher_device))
            else:
                from rlstruct.envs.atari import make_atari_env

                create_env = make_atari_env
        if layout.pipeline > 1 and not pipelined:
            raise ConfigError(
                f"{self.algo} collects synchronously; --pipeline {layout.pipeline} is for "
                "algorithms that learn from one segment while the next is collected (ppo, a2c)"
            )
        if self.cfg.env_module:  # every process that builds an env imports them first
            create_env = EnvModules(create_env, self.cfg.env_module)
        self._eval_agent = self._eval_agent or (create_agent, dict(agent_args), None)
        batcher = make_batcher(
            device=layout.batcher_device, n_processes=layout.n_processes,
            n_timesteps=n_timesteps, create_agent=create_agent, agent_args=agent_args,
            create_env=create_env, env_args=env_args,
            seeds=self.cfg.seed + 10_007 * self.n_resumes,  # fresh env seeds after a resume
            agent_info=agent_info, check_devices=layout.check_devices,
            pipeline=layout.pipeline, backend=layout.backend, ray_address=layout.ray_address,
            **layout.batcher_options(),  # --max-restarts, the Ray actors' resources
        )
        self._training_batcher = batcher  # Run.learner_group publishes into it
        if hasattr(batcher, "external_cpu_seconds"):  # workers outside this tree (Ray actors)
            self.monitor.watch(batcher)
        return self._stack.enter_context(batcher)

    def evaluator(
        self,
        create_agent: Callable[..., Agent],
        agent_args: dict[str, Any],
        agent_info: DictTensor | None = None,
    ) -> Evaluator | None:
        """Sets up the :class:`~rlstruct.runs.evaluator.Evaluator` (``eval_envs`` episodes on
        ``eval_device``, seed ``seed + 1000``) that :meth:`end_iteration` drives; ``None`` when
        ``eval_every`` is 0. Call it while the model is still on the CPU."""
        self._eval_agent = (create_agent, dict(agent_args), agent_info)  # for the checkpoints
        if self.cfg.eval_every == 0 or self.cfg.env_backend == "atari":
            return None  # Atari: an evaluation episode is thousands of 4x84x84 frames
        self._evaluator = self._stack.enter_context(Evaluator(
            create_agent, agent_args, self.cfg.env_id, self.cfg.eval_envs,
            seed=self.cfg.seed + 1000, device=self.cfg.layout.eval_device,
            agent_info=agent_info, check_devices=self.cfg.layout.check_devices,
            env_modules=self.cfg.env_module,
        ))
        return self._evaluator

    def model(self, cls: Callable[..., torch.nn.Module], *args: Any, **kwargs: Any) -> Any:
        """``cls(*args, **kwargs)``, the call recorded in the checkpoints (``constructors``) so
        that ``python -m rlstruct evaluate`` rebuilds the model without reading the algorithm's
        code. The arguments must be plain values (numbers, strings, lists, dicts); ``cls`` may be a
        ``functools.partial`` of such a call."""
        if isinstance(cls, functools.partial):  # a factory that the learner ranks also use
            args, kwargs, cls = (*cls.args, *args), {**cls.keywords, **kwargs}, cls.func
        module = cls(*args, **kwargs)
        self._constructors.append(
            (module, {"class": ckpt.object_path(cls), "args": list(args), "kwargs": dict(kwargs)}))
        return module

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
        """The learner group the algorithm learns with: its ranks run the algorithm's
        ``learn(agent, optimizer, batch, cfg, step)`` on their rows of each batch
        (:func:`~rlstruct.learners.rank.algorithm_learn`), starting from ``model``'s weights,
        and each rank builds its optimizer with ``make_optimizer(params, device=...)``.

        One learner (the default): a :class:`~rlstruct.learners.local.LocalLearner` on
        ``model`` itself, on the learner device, in this process (``run.out_of_time`` reaches
        a ``learn`` that takes ``out_of_time``). ``--n-learners N`` (or ``--learner-devices``):
        a :class:`~rlstruct.learners.group.LearnerGroup` of N processes;
        ``--learner-backend ray``: a :class:`~rlstruct.learners.ray_group.RayLearnerGroup`; under
        torchrun, rank 0's :func:`~rlstruct.learners.torchrun.torchrun_group`. Closed with the
        run. Checkpoints hold the group's (rank 0's) model as ``model`` and its optimizer as
        ``optimizer``.

        Args:
            make_model: builds a rank's replica (picklable for the process and Ray ranks).
            model: the algorithm's model (its weights start every rank).
            make_optimizer: ``make_optimizer(params, device=...)``.
            learn: the algorithm's learn function.
            make_agent: ``make_agent(model)``, the agent ``learn`` gets (None: the model);
                wrapped in CheckDevice with ``--check-devices``.
            per_rank: integer config fields divided among the ranks (``minibatch_size``).
            stacked: batches of ``k`` stacked minibatches, one ``learn`` each.
            policy: the prefix of the policy's weights in ``model`` (SAC: ``"actor."``, the
                module the workers and the evaluation run): checkpoints then hold them as
                ``model`` and the whole learner model as ``learner``.
        """
        from rlstruct.runs.groups import learner_group

        return learner_group(self, make_model, model, make_optimizer, learn, make_agent,
                             per_rank, stacked, policy)

    def checkpoint_state(self, **objects: Any) -> None:
        """What checkpoints hold: ``name -> obj.state_dict()`` for each object given (model,
        optimizer, ...), plus the config, the counters, the RNG states and the clock (see
        :meth:`checkpoint`). A resumed run (``--resume``) loads each object's state from the
        checkpoint here, and the RNG states.

        Raises:
            CheckpointError: the checkpoint being resumed holds no state for one of them, or a
                state that does not load into it.
        """
        self._saved.update(objects)
        if not self._resumed:
            return
        for name, obj in objects.items():
            if name not in self._resumed:
                raise CheckpointError(f"resume: {self.cfg.resume} has no state for {name!r} "
                                      f"(it holds {sorted(self._resumed)})")
            try:
                obj.load_state_dict(self._resumed[name])
            except (ValueError, RuntimeError, KeyError) as err:  # torch's words for "not this"
                raise CheckpointError(
                    f"resume: the state of {name!r} in {self.cfg.resume} does not fit this "
                    f"run's {type(obj).__name__} (a checkpoint of another model or optimizer "
                    f"layout, or of an earlier rlstruct version): {err}") from err
        ckpt.set_rng_state(self._resumed["rng"])

    def out_of_time(self) -> bool:
        """True once the time budget is spent: one clock read, for learn loops to call between
        minibatches (the run then stops before collecting again)."""
        return time.monotonic() - self.start >= self.cfg.time_budget

    # ------------------------------------------------------------------ the loop
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
            self.stopped_by, self._solved_at = "target_return", (self.frames, elapsed)
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
        return (self._evaluator is not None and target is not None
                and math.isfinite(self.eval_return) and self.eval_return < target)

    @property
    def done(self) -> bool:
        """True once the stop test (target return, frame or time budget) has fired."""
        return self.stopped_by is not None

    def end_iteration(self, weights: Any, **metrics: float) -> None:
        """Ends an iteration: picks up a finished evaluation, starts one every ``eval_every``
        iterations with ``weights`` (e.g. ``model.state_dict()``), writes the progress row
        (``eval_return`` only when an evaluation finished, nan otherwise) and saves a
        checkpoint every ``checkpoint_every`` iterations."""
        self.iteration += 1
        eval_return = math.nan
        if self._evaluator is not None:
            result = self._evaluator.poll()
            if result is not None:
                eval_return = self.eval_return = result
            if self.iteration % self.cfg.eval_every == 0:
                self._evaluator.start(weights)
        metrics = {**metrics, **self.monitor.sample(self.frames)}
        self.logger.log(self.frames, iteration=self.iteration, eval_return=eval_return, **metrics)
        if self.iteration % self.cfg.checkpoint_every == 0:
            self.checkpoint()

    def resume_state(self, **objects: Any) -> None:
        """States that only a resume needs, too large to copy into ``best.pt`` (a replay
        buffer): each is saved to ``checkpoints/<name>.pt`` with every checkpoint and loaded on
        ``--resume`` (:func:`~rlstruct.runs.checkpoint.load_resume_files`: a run checkpointed
        without one resumes with the object as built, and says so on stderr).

        Raises:
            CheckpointError: the saved state does not load into the object.
        """
        self._resume_only.update(objects)
        if self._resumed:
            ckpt.load_resume_files(Path(self.cfg.resume or "") / "checkpoints", objects,
                              self._resumed.get("iteration"))

    def checkpoint(self) -> None:
        """Saves ``checkpoints/latest.pt`` (and ``best.pt`` by the train return): the
        :meth:`checkpoint_state` objects' states, ``algo``, the whole ``config``, ``frames``,
        ``iteration``, ``episodes``, ``resumes``, ``wall_time``, ``eval_return``,
        ``solved_at``, ``best_score``, the ``rng`` states, the ``constructors`` of the models
        built by :meth:`model` and the evaluation ``agent`` (class, arguments, agent_info).

        Raises:
            CheckpointError: the write failed (e.g. a full disk; the last good one is kept).
        """
        state = {name: obj.state_dict() for name, obj in self._saved.items()}
        modules = {name: self._stands_for.get(name, obj) for name, obj in self._saved.items()}
        state.update(
            algo=self.algo, config=config_to_dict(self.cfg), frames=self.frames,
            iteration=self.iteration, episodes=self.logger.episodes, resumes=self.n_resumes,
            wall_time=time.monotonic() - self.start, eval_return=self.eval_return,
            solved_at=None if self._solved_at is None else list(self._solved_at),
            best_score=self.logger.best_score, rng=ckpt.rng_state(),
            constructors={name: spec for name, obj in modules.items()
                          for built, spec in self._constructors if obj is built},
            agent=None if self._eval_agent is None else ckpt.agent_spec(*self._eval_agent, modules),
        )
        folder = self.logger.dir / "checkpoints"
        folder.mkdir(exist_ok=True)
        ckpt.save_resume_files(folder, self._resume_only, self.iteration)  # before latest.pt
        self.logger.checkpoint(state, score=self.logger.train_return())
        self._checkpointed = {"frames": self.frames, "iteration": self.iteration}

    def _remove_partial_files(self) -> None:
        """Before a second signal ends the process: no half-written checkpoint is left."""
        for tmp in (self.logger.dir / "checkpoints").glob("*.tmp"):
            tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------------ teardown
    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Writes the last progress row and checkpoint (also on Ctrl-C and SIGTERM; no
        checkpoint where they stopped it before its first iteration ended), closes the
        batchers, the evaluator and the logger (which plots), then sets and prints
        :attr:`summary` and writes it to ``summary.json``. Any other exception still leaves a
        ``summary.json`` with status ``failed`` and the error, unless the run failed before its
        first iteration (:class:`~rlstruct.runs.lock.FolderGuard`).

        A run stopped by a signal (:mod:`rlstruct.runs.signals`) first collects a batch its
        learner group still learns on, so the checkpoint's frames are the summary's; it then
        raises :class:`~rlstruct.runs.signals.Terminated`, also when the stop waited for the
        loop body and the loop ended on its own."""
        self.signals.teardown()
        # An error after a stop signal (not a learner rank's) is taken for its consequence:
        # a signal to the whole process group (Slurm, ``timeout``) also stops the workers.
        after = (exc is not None and self.signals.requested
                 and not isinstance(exc, (KeyboardInterrupt, LearnerError)))
        if after:
            self._after_signal, exc_type = f"{type(exc).__name__}: {exc}", None
        finish = exc_type is None or issubclass(exc_type, KeyboardInterrupt)
        by_signal = isinstance(exc, Terminated) or (
            (exc is None or after) and self.signals.requested
            and self.stopped_by in (None, "interrupted"))
        try:
            if finish:
                if self.stopped_by is None:  # Ctrl-C, or a loop that ended on its own
                    self.stopped_by = ("interrupted" if exc_type is not None or by_signal
                                       else "loop_end")
                if by_signal:
                    self._cause = lost_rank(self._groups)
                if self.logger.n_rows == 0 or self.logger.frames != self.frames:
                    self.logger.log(self.frames, iteration=self.iteration, eval_return=math.nan,
                                    **self.monitor.sample(self.frames))
                # A stop before the first iteration may come before the algorithm registered
                # all its state (the learner comes after the batchers): no checkpoint then,
                # which ``--resume auto`` reads as a run to start afresh (a resumed one keeps
                # its own).
                if self.iteration > self._resumed_at or self.stopped_by != "interrupted":
                    self._checkpoint_error = final_checkpoint(self.checkpoint, self._groups,
                                                              by_signal or exc_type is not None)
        finally:
            try:
                self._stack.close()
            finally:
                try:
                    self.logger.close()
                finally:
                    self.signals.restore()
                    self._write_summary(finish, exc)
                    self._guard.close(not finish and self.iteration == self._resumed_at,
                                      isinstance(exc, ConfigError))
        if finish:
            print(describe(self.algo, self.summary, self.logger.train_column))
            print(f"outputs in {self.logger.dir}", flush=True)
        if by_signal and (exc is None or after):
            raise self.signals.stop_now() from None

    def _write_summary(self, finish: bool, exc: BaseException | None) -> None:
        summary = run_summary(self, finish, exc)
        if finish:
            self.summary = summary
        try:
            self.logger.write_summary(summary)
        except OSError as err:  # e.g. a full disk: never hide the run's own outcome
            warnings.warn(f"could not write {self.logger.dir / 'summary.json'}: {err}",
                          stacklevel=2)


def _code_dir(cfg: RunConfig) -> Path | None:
    """The folder of the module that defines the config's class: the algorithm's code."""
    module = sys.modules.get(type(cfg).__module__)
    path = getattr(module, "__file__", None)
    return Path(path).resolve().parent if path else None

"""``Evaluator``: full evaluation episodes on a batcher of their own, beside training.

On the CPU the evaluation batcher is a :class:`~rlstruct.Batcher` with ONE worker process:
:meth:`Evaluator.start` sends the latest weights, resets the envs and launches the episodes, then
returns; :meth:`Evaluator.poll` picks the result up with ``get(blocking=False)``. The episodes
run in that worker while the learner trains, so the learner only pays for the ``update`` and the
``reset`` (a few milliseconds) and, on a machine with spare cores, loses nothing else; on a
machine whose cores are all busy, the evaluation takes its share of them.

The worker starts in a background thread, so its start-up (a second or two to import torch)
never holds training either: until it is up, :meth:`Evaluator.start` returns ``False`` and the
evaluation is skipped, not queued. A failure while starting is raised by the next call.

An error of the evaluation's env or agent is a :class:`~rlstruct.errors.WorkerError` whose
message starts with ``evaluation of <env id>, episode <k>``: never mistaken for a training
worker's (whose messages start with ``worker <w>``).

On an accelerator (``device="cuda"``) the evaluation batcher is a
:class:`~rlstruct.SerialBatcher` in the calling process: ``start`` then plays the whole episodes
before it returns, and training waits for them.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.batchers.make import checked_agent_factory
from rlstruct.devices import is_accelerator, resolve_device
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.envs import GymEnv
from rlstruct.envs.registry import EnvModules, env_spec, import_env_modules
from rlstruct.errors import WorkerError
from rlstruct.runs.episodes import EpisodeTracker

__all__ = ["Evaluator", "evaluation_error"]

#: Seconds the evaluation worker may take to start.
START_TIMEOUT_S = 120.0


class Evaluator:
    """Plays ``n_envs`` full episodes of ``env_id`` with the latest weights, without waiting.

    Args:
        create_agent: ``create_agent(**agent_args) -> Agent``, as for a batcher.
        agent_args: its keyword arguments; modules and tensors are copied to the CPU at once
            (the evaluation batcher owns its copy; the caller may move or train its own).
        env_id: gymnasium id; each episode runs in a ``GymEnv`` (one episode per env).
        n_envs: episodes per evaluation.
        seed: the evaluation batcher's run seed.
        device: where the evaluation agent runs (see the module docstring).
        agent_info: example agent_info (1 or ``n_envs`` rows), e.g. ``{"greedy": [True]}``.
        check_devices: wrap the evaluation agent in :class:`~rlstruct.CheckDevice`.
        n_timesteps: steps per segment (default: the env's ``max_episode_steps``, else 1000);
            longer episodes take several segments.
        env_modules: modules that register ``env_id`` with gymnasium, imported here and in the
            evaluation worker before it builds its envs (``env_id`` may also be ``pkg.mod:Id``).
    """

    def __init__(
        self,
        create_agent: Callable[..., Agent],
        agent_args: Mapping[str, Any],
        env_id: str,
        n_envs: int,
        *,
        seed: int = 0,
        device: DeviceLike = "cpu",
        agent_info: DictTensor | None = None,
        check_devices: bool = False,
        n_timesteps: int | None = None,
        env_modules: Sequence[str] = (),
    ) -> None:
        device = resolve_device(device)
        import_env_modules(env_modules)
        if check_devices:
            create_agent = checked_agent_factory(create_agent, device)
        args: dict[str, Any] = dict(
            n_timesteps=n_timesteps or env_spec(env_id).max_episode_steps or 1000,
            create_agent=create_agent,
            agent_args=_cpu_snapshot(agent_args),
            create_env=EnvModules(GymEnv, env_modules) if env_modules else GymEnv,
            env_args={"env": env_id, "n_envs": n_envs},
            seeds=seed,
            agent_info=agent_info,
        )
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future[Batcher | SerialBatcher] = Future()
        if is_accelerator(device):
            self._future.set_result(SerialBatcher(**args, device=device))
        else:  # the worker starts in the background
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlstruct-evaluator")
            self._future = self._pool.submit(
                Batcher, **args, n_processes=1, start_timeout=START_TIMEOUT_S
            )
        self.env_id = env_id
        self._tracker = EpisodeTracker()
        self._returns: list[float] = []
        self.busy = False
        self.n_started = 0
        self._closed = False

    @property
    def ready(self) -> bool:
        """True once the evaluation batcher is up (raises what its start-up raised)."""
        if not self._future.done():
            return False
        with self._named():
            self._future.result()
        return True

    def start(self, weights: Any = None) -> bool:
        """Starts an evaluation with ``weights`` (what ``batcher.update`` takes, e.g. a
        ``state_dict``; ``None``: the weights it has) unless one is running or the worker is
        still starting; returns whether it started."""
        if self.busy or not self.ready:
            return False
        batcher = self._future.result()
        with self._named():
            if weights is not None:
                batcher.update(weights)
            batcher.reset()
            batcher.execute()
        self._returns, self.busy = [], True
        self.n_started += 1
        return True

    def poll(self) -> float | None:
        """The mean return of the evaluation that has just finished, else ``None`` (none is
        running, or it is still playing). Never waits."""
        if not self.busy:
            return None
        batcher = self._future.result()
        with self._named():
            traj, n_running = batcher.get(blocking=False)
        if traj is None:
            return None
        self._returns += self._tracker(traj)[0].tolist()
        if n_running:  # episodes longer than a segment: play on
            with self._named():
                batcher.execute()
            return None
        self.busy = False
        return sum(self._returns) / len(self._returns)

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        """A WorkerError of the evaluation batcher, named as the evaluation's."""
        try:
            yield
        except WorkerError as err:
            raise evaluation_error(err, self.env_id) from err

    def close(self) -> None:
        """Stops the evaluation worker (waiting for it to finish starting, if need be)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._future.exception() is None:
                self._future.result().close()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def evaluation_error(err: WorkerError, env_id: str) -> WorkerError:
    """``err`` (of the evaluation batcher) as the same error type whose message names the
    evaluation: ``evaluation of <env_id>, episode <k> (the evaluation's worker, not a training
    one): <err's message>``."""
    episode = "" if err.env is None else f", episode {err.env}"
    message = str(err.args[0]) if err.args else ""
    return type(err)(
        f"evaluation of {env_id}{episode} (the evaluation's own env and worker, not a "
        f"training one): {message}",
        worker=err.worker, env=err.env, step=err.step, exc_type=err.exc_type,
        remote_traceback=err.remote_traceback, exitcode=err.exitcode)


def _cpu_snapshot(agent_args: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``agent_args`` whose modules and tensors are on the CPU."""
    copied = copy.deepcopy(dict(agent_args))
    return {k: v.cpu() if isinstance(v, (torch.nn.Module, torch.Tensor)) else v
            for k, v in copied.items()}

"""What ``RayBatcher`` asks Ray about its actors: the remote actor class, spawning and killing an
actor, reading a call's answer as a value or a typed :class:`~rlstruct.errors.WorkerError`, and
the cluster's free resources (a hint when an actor does not start).

The actor's body is Ray-free (:mod:`~rlstruct.batchers.ray.actor`); the driver that waits on
the answers is :mod:`~rlstruct.batchers.ray.batcher`. Ray comes from
:mod:`rlstruct.parallel.ray_cluster` (None when it is not installed: nothing here is called then).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from rlstruct.batchers.pool import worker_error
from rlstruct.batchers.ray.actor import ActorBody, ActorSpec
from rlstruct.errors import WorkerError
from rlstruct.parallel.ray_cluster import ray

__all__ = ["RayBatcherWorker", "spawn_actor", "kill_actor", "read_answer", "free_resources"]


class RayBatcherWorker(ActorBody):
    """A RayBatcher actor (wrapped with ``ray.remote`` by :func:`spawn_actor`): the Ray-free
    :class:`~rlstruct.batchers.ray.actor.ActorBody`, plus the two calls that need Ray."""

    def _fetch(self, refs: list[Any]) -> list[Any]:
        return ray.get(refs, timeout=self.spec.timeout)

    def _where(self) -> dict[str, Any]:
        return {"node": ray.get_runtime_context().get_node_id(), **self.core.where()}


_ACTOR_CLASS: list[Any] = []


def _actor_class() -> Any:
    if not _ACTOR_CLASS:
        _ACTOR_CLASS.append(ray.remote(RayBatcherWorker))
    return _ACTOR_CLASS[0]


def spawn_actor(
    spec: ActorSpec, num_cpus: float, num_gpus: float, options: Mapping[str, Any]
) -> tuple[Any, Any]:
    """Creates the actor of ``spec`` and asks it to start (Ray never restarts or retries it).

    Args:
        spec: what the actor builds and serves.
        num_cpus: CPUs Ray reserves for it.
        num_gpus: GPUs Ray reserves for it.
        options: more ``ray.remote`` options.

    Returns:
        ``(actor, the ObjectRef of its start)``.
    """
    actor = (
        _actor_class()
        .options(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            max_restarts=0,
            max_task_retries=0,
            **options,
        )
        .remote(spec)
    )
    return actor, actor.start.remote()


def kill_actor(actor: Any) -> None:
    """Kills ``actor`` now, never restarted; one that is gone already is no error."""
    with contextlib.suppress(Exception):  # a dead actor is what is being killed
        ray.kill(actor, no_restart=True)


def free_resources() -> Any:
    """The cluster's free resources (memory left out), or ``"unknown"`` when Ray cannot say."""
    with contextlib.suppress(Exception):  # only a hint: "unknown" when Ray cannot say
        return {k: v for k, v in ray.available_resources().items() if "memory" not in k}
    return "unknown"


def read_answer(w: int, ref: Any, what: str, timeout: float) -> tuple[str, Any]:
    """Reads the answer of worker ``w``'s finished call ``ref``, made during ``what``.

    Args:
        w: the worker's index.
        ref: the call's ObjectRef.
        what: what the call does (``"start"``, ``"restart"``, ``"reset"``, ``"execute"``).
        timeout: seconds ``ray.get`` may take.

    Returns:
        ``("ok", value)``; ``("lost", error)`` when the actor is gone (its process killed, its
        node lost); ``("failed", error)`` when Ray failed the call or the env/agent raised in
        the actor (``error``: a :class:`~rlstruct.errors.WorkerError`).

    Raises:
        TimeoutError: ``ray.get`` timed out.
    """
    try:
        status, payload = ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(f"worker {w} did not answer during {what}") from None
    except ray.exceptions.RayActorError as e:
        return "lost", WorkerError(
            f"worker {w} died during {what}: its Ray actor is gone ({type(e).__name__}; "
            "Ray's account below)",
            worker=w,
            remote_traceback=str(e),
        )
    except ray.exceptions.RayError as e:
        return "failed", WorkerError(
            f"worker {w} failed during {what}: {type(e).__name__}",
            worker=w,
            exc_type=type(e).__name__,
            remote_traceback=str(e),
        )
    if status == "ok":
        return "ok", payload
    prefix = "the replacement of " if what == "restart" else ""
    return "failed", worker_error(payload, w, prefix)

"""Learner ranks as Ray actors: the learner group's ranks placed by Ray, GPUs asked per rank.

A :class:`RayLearnerGroup` starts N Ray actors ("ranks") that ask for ``num_gpus`` each
(fractions allowed) and any custom ``resources``, while the batcher's actors ask for CPUs or a
``rollout`` resource: Ray puts the learners on the GPU node and the rollouts elsewhere (the
heterogeneous job of docs/guide-learners.md). The ranks form a ``torch.distributed`` group among
themselves (rank 0's actor hosts the rendezvous on its node's address; NCCL when each rank has a
whole GPU, gloo otherwise), learn on their rows of each batch with gradients averaged
(:class:`~rlstruct.learners.rank.RankContext`), and rank 0 returns the new weights.

The driver's calls are those of :class:`~rlstruct.learners.group.LearnerGroup` (``learn``,
``submit``, ``collect``, ``state_dict``, ``optimizer``, ``close``). Shards travel through Ray's
object store (``ray.put``), so the ranks may run on other nodes than the driver.

Failures: an actor that dies gives :class:`~rlstruct.errors.LearnerError` naming its rank
(``exitcode`` unknown); one whose learn function raises, a ``LearnerError`` with the rank's
traceback; ranks that do not answer within ``timeout``, :class:`LearnerTimeoutError` naming
them. :meth:`RayLearnerGroup.close` asks the ranks to leave their group, then kills every actor,
in bounded time.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import cloudpickle
import torch
from torch import Tensor

from rlstruct.errors import BatcherStateError, LearnerError, LearnerTimeoutError
from rlstruct.learners.base import LearnerGroupBase, LearnFn, ModelFactory, OptimizerFactory
from rlstruct.learners.rank import RankContext, _as_metrics
from rlstruct.learners.staging import pack, split_rows, unpack

__all__ = ["RayLearnerGroup"]

def _ray() -> Any:
    """The ``ray`` module (:mod:`rlstruct.parallel.ray_cluster`, the one module of rlstruct that
    imports it).

    Raises:
        ImportError: Ray is not installed.
    """
    from rlstruct.parallel.ray_cluster import require_ray

    return require_ray("RayLearnerGroup")


_GRACE_S = 1.0  # after a failure, how long to listen for the other ranks (to name the culprit)


class _Rank:
    """The body of one rank's actor (wrapped with ``ray.remote`` at group creation)."""

    def __init__(self, rank: int, world: int, spec: bytes) -> None:
        self.rank, self.world, self.spec = rank, world, spec
        self.ctx: RankContext | None = None

    def address(self) -> tuple[str, int]:
        """Rank 0: its node's address and a free port for the rendezvous."""
        host = _ray().util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return host, int(s.getsockname()[1])

    def join(self, init_method: str, timeout: float) -> int:
        """Joins the group, builds the replica; returns the pid."""
        import torch.distributed as dist

        make_model, make_optimizer, learn, init_state, cuda, n_threads, bucket = \
            cloudpickle.loads(self.spec)
        torch.set_num_threads(n_threads)
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")  # Ray's visible GPU
        dist.init_process_group("nccl" if cuda == "nccl" else "gloo", init_method=init_method,
                                rank=self.rank, world_size=self.world,
                                timeout=timedelta(seconds=timeout))
        model = make_model().to(device)
        model.load_state_dict(init_state)
        optimizer = make_optimizer(model.parameters(), device=device)
        self.ctx = RankContext(self.rank, self.world, device, model, optimizer,
                               bucket_bytes=bucket)
        self.learn_fn = learn
        return os.getpid()

    def learn(self, kind: str, shard: dict[str, Tensor], kwargs: dict) -> tuple:
        """``(metrics, timings, weights or None)``: rank 0 returns its new weights (CPU)."""
        ctx = self.ctx
        assert ctx is not None
        tensors = {k: v.to(ctx.device) for k, v in shard.items()}
        ctx.allreduce_ms, ctx.n_allreduce = 0.0, 0
        start = time.perf_counter()
        metrics = _as_metrics(self.learn_fn(ctx, unpack(kind, tensors), **kwargs))
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        timings = {"rank_learn_ms": (time.perf_counter() - start) * 1e3,
                   "allreduce_ms": ctx.allreduce_ms, "n_allreduce": float(ctx.n_allreduce)}
        weights = ({k: v.detach().cpu() for k, v in ctx.model.state_dict().items()}
                   if self.rank == 0 else None)
        return metrics, timings, weights

    def optimizer_state(self) -> dict[str, Any]:
        """This rank's optimizer state (CPU)."""
        assert self.ctx is not None
        return self.ctx.optimizer.state_dict()

    def load(self, state: dict[str, Tensor] | None, optimizer_state: dict | None) -> None:
        """Loads weights and/or an optimizer state (a resume; the same on every rank)."""
        assert self.ctx is not None
        if state is not None:
            self.ctx.model.load_state_dict(state)
        if optimizer_state is not None:
            self.ctx.optimizer.load_state_dict(optimizer_state)

    def leave(self) -> None:
        """Destroys the process group."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RayLearnerGroup(LearnerGroupBase):
    """``n_learners`` ranks as Ray actors (see the module notes).

    Args:
        make_model, make_optimizer, learn, init_state: as for LearnerGroup.
        n_learners: the number of ranks (each batch's rows must be a multiple of it).
        num_gpus: GPUs per rank (fractions allowed; < 1 learns with gloo, a whole GPU with
            NCCL); 0: the CPU.
        num_cpus: CPUs per rank.
        resources: custom Ray resources per rank (e.g. ``{"learner": 1}``).
        address: the Ray cluster, when this process is not connected yet (as for RayBatcher:
            ``None`` joins ``RAY_ADDRESS``, else starts a local loopback cluster); the group
            then owns the connection with the batchers, and the last to close shuts it down.
        timeout: seconds a batch may take before :class:`LearnerTimeoutError`.
        start_timeout: seconds for the actors to be placed and join.
        n_threads: torch threads per rank.
        bucket_mb: megabytes of gradients per all-reduce bucket.

    Raises:
        ConfigError: bad arguments (listed).
    """

    def __init__(self, make_model: ModelFactory, make_optimizer: OptimizerFactory,
                 learn: LearnFn, init_state: Mapping[str, Tensor], n_learners: int = 1, *,
                 num_gpus: float = 0.0, num_cpus: float = 1.0,
                 resources: dict[str, float] | None = None, address: str | None = None,
                 timeout: float = 300.0, start_timeout: float = 120.0, n_threads: int = 1,
                 bucket_mb: float = 25.0) -> None:
        ray = _ray()
        problems = []
        if isinstance(n_learners, bool) or not isinstance(n_learners, int) or n_learners < 1:
            problems.append(f"n_learners must be an integer >= 1, got {n_learners!r}")
        for name, value in (("num_gpus", num_gpus), ("num_cpus", num_cpus)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                problems.append(f"{name} must be a finite number >= 0, got {value!r}")
        self._setup("RayLearnerGroup", problems, make_model, make_optimizer, learn, init_state,
                    timeout, start_timeout, bucket_mb)
        from rlstruct.parallel.ray_cluster import SESSION

        self._session = SESSION
        self._owns_ray = self._session.acquire(address, max(1, math.ceil(n_learners * num_cpus)))
        self.n_learners = n_learners
        mode = "nccl" if num_gpus >= 1 else "gloo-cuda" if num_gpus > 0 else ""
        spec = cloudpickle.dumps((make_model, make_optimizer, learn,
                                  {k: v.detach().cpu() for k, v in init_state.items()},
                                  mode, n_threads, self.bucket_bytes))
        actor = ray.remote(_Rank).options(num_gpus=num_gpus, num_cpus=num_cpus,
                                          resources=resources or {}, max_restarts=0)
        self._actors = [actor.remote(r, n_learners, spec) for r in range(n_learners)]
        self._closed = False
        self._pending: list[Any] | None = None
        self._latest = {k: v.detach().cpu().clone() for k, v in init_state.items()}
        self._index = 0
        try:
            host, port = self._get([self._actors[0].address.remote()], start_timeout,
                                   "being placed")[0]
            self.pids = self._get([a.join.remote(f"tcp://{host}:{port}", self.timeout)
                                   for a in self._actors], start_timeout, "joining the group")
        except BaseException:
            self.close()
            raise

    @property
    def pending(self) -> int:
        """Batches submitted but not collected (0 or 1)."""
        return int(self._pending is not None)

    def submit(self, batch: Any, **kwargs: Any) -> None:
        """Sends each rank its rows (through the object store) and returns at once.

        Raises:
            ShapeError: the rows are not a multiple of ``n_learners``.
            BatcherStateError: a batch is in flight, or the group is closed.
        """
        ray = _ray()
        if self._closed:
            raise BatcherStateError("the Ray learner group is closed")
        if self._pending is not None:
            raise BatcherStateError("submit: collect() the previous batch first")
        kind, tensors = pack(batch)
        shards = split_rows({k: v.detach().cpu() for k, v in tensors.items()}, self.n_learners)
        self._pending = [a.learn.remote(kind, ray.put(s), kwargs)
                         for a, s in zip(self._actors, shards)]

    def collect(self, timeout: float | None = None) -> dict[str, float]:
        """Waits for every rank; the learn function's metrics averaged over the ranks and the
        slowest rank's timings.

        Raises:
            BatcherStateError: nothing was submitted.
            LearnerError: a rank raised (its traceback) or its actor died, named.
            LearnerTimeoutError: ranks that did not answer in time, named.
        """
        if self._pending is None:
            raise BatcherStateError("collect: no batch submitted (submit(batch) first)")
        refs, self._pending = self._pending, None
        answers = self._get(refs, self.timeout if timeout is None else timeout,
                            f"learning batch {self._index}")
        self._index += 1
        self._latest = answers[0][2]
        metrics = {k: sum(a[0].get(k, math.nan) for a in answers) / len(answers)
                   for k in answers[0][0]}
        for key in ("rank_learn_ms", "allreduce_ms"):
            metrics[key] = max(a[1][key] for a in answers)
        metrics["n_allreduce"] = answers[0][1]["n_allreduce"]
        return metrics

    def _weights(self) -> dict[str, Tensor]:
        """Rank 0's weights, returned with its answer."""
        return self._latest

    def optimizer_state_dict(self) -> dict[str, Any]:
        """Rank 0's optimizer state."""
        return self._get([self._actors[0].optimizer_state.remote()], self.timeout,
                         "sending its optimizer state")[0]

    def _load(self, state: Mapping[str, Tensor] | None, optimizer_state: dict | None) -> None:
        """Every rank loads ``state`` and/or ``optimizer_state``."""
        if self._closed or self._pending is not None:
            raise BatcherStateError("load: the Ray learner group is closed or has a batch in "
                                    "flight (collect it first)")
        if state is not None:
            state = {k: v.detach().cpu().clone() for k, v in state.items()}
        self._get([a.load.remote(state, optimizer_state) for a in self._actors], self.timeout,
                  "loading a state")
        if state is not None:
            self._latest = state

    def close(self, timeout: float = 10.0) -> None:
        """Asks the ranks to leave their group, then kills every actor. Idempotent."""
        ray = _ray()
        if self._closed:
            return
        self._closed = True
        refs = [a.leave.remote() for a in self._actors]
        with contextlib.suppress(Exception):  # ranks that cannot leave are killed next
            ray.wait(refs, num_returns=len(refs), timeout=max(0.0, timeout - 1.0))
        for a in self._actors:
            with contextlib.suppress(Exception):  # an actor that is dead already
                ray.kill(a, no_restart=True)
        if self._owns_ray:
            self._session.release()

    def _get(self, refs: list[Any], seconds: float, what: str) -> list[Any]:
        """Every result; or the error of the first culprit (an actor that died, then a rank that
        raised outside the gradient all-reduce: one that failed inside it is a victim); or a
        timeout naming the ranks that did not answer."""
        ray = _ray()
        errors = ray.exceptions
        rank_of = {ref: k for k, ref in enumerate(refs)}
        waiting, deadline = list(refs), time.monotonic() + seconds
        failed: list[tuple[int, int, BaseException]] = []
        while waiting:
            remaining = deadline - time.monotonic()
            if failed:  # a short grace for the other ranks' reports
                remaining = min(remaining, _GRACE_S)
            ready, waiting = ray.wait(waiting, num_returns=1, timeout=max(0.0, remaining))
            if not ready:
                if failed:
                    break
                ranks = sorted(rank_of[r] for r in waiting)
                raise LearnerTimeoutError(f"Ray learner group: ranks {ranks} did not finish "
                                          f"{what} within {seconds:g} s", ranks=ranks)
            try:
                ray.get(ready[0])
            except errors.RayActorError as err:
                failed.append((0, rank_of[ready[0]], err))
            except errors.RayTaskError as err:
                victim = "average_gradients" in str(err)
                failed.append((2 if victim else 1, rank_of[ready[0]], err))
        if not failed:
            return ray.get(refs)
        _, rank, err = min(failed, key=lambda f: (f[0], f[1]))
        if isinstance(err, errors.RayActorError):
            raise LearnerError(f"Ray learner group: rank {rank}'s actor died while {what}",
                               rank=rank) from err
        cause = getattr(err, "cause", None) or err
        raise LearnerError(f"Ray learner group: rank {rank} raised {type(cause).__name__}: "
                           f"{cause} while {what}", rank=rank, exc_type=type(cause).__name__,
                           learner_traceback=str(err)) from err

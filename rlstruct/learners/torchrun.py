"""The learner group under ``torchrun``: N processes started by torchrun, rank 0 the driver.

``torchrun --nproc-per-node N -m rlstruct.algos.ppo ...`` runs the same job as ``--n-learners N``.
Every process starts the algorithm's script; :class:`~rlstruct.runs.run.Run` sends the processes
with ``RANK > 0`` into :func:`serve_rank` (:mod:`rlstruct.learners.torchrun_ranks`, with what
both sides share) before it creates anything (no run folder, batcher or evaluator there), so
only rank 0 owns the batcher, the logger, the evaluator and the checkpoints.
Rank 0's ``Run.learner_group`` returns a :class:`TorchrunLearnerGroup`, which has
:class:`~rlstruct.learners.group.LearnerGroup`'s driver calls (``learn``, ``submit``,
``collect``, ``state_dict``, ``optimizer``, ``close``), so the algorithm's loop does not change.

- Rendezvous: the variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT``); the TCP store is torchrun's agent store when torchrun hosts
  one (``TORCHELASTIC_USE_AGENT_STORE``), else rank 0's.
- Devices: ``cuda:LOCAL_RANK`` with NCCL when the learner device is CUDA, else the CPU with gloo.
  Batches and control messages always travel over two gloo groups on the CPU.
- One batch: rank 0 broadcasts a header (keys, shapes, dtypes, keyword arguments), scatters
  each rank its rows (one byte buffer per rank), every rank (rank 0 too, in the driver process)
  runs the learn function on its shard with gradients averaged over the ranks
  (:class:`~rlstruct.learners.rank.RankContext`), and rank 0 gathers the ranks' metrics and a
  checksum of their parameters (``replica_spread``: 0 when the replicas are identical).
  There is no staging ahead of the learner here: the batch travels when it is learned.
- Failures: every rank > 0 beats a heartbeat counter in the store, writes its phase there, and
  its traceback when it raises. When a collective fails or times out on rank 0 it reads them:
  :class:`~rlstruct.errors.LearnerError` names a rank that raised (with its traceback) or
  whose heartbeat stopped (died); :class:`~rlstruct.errors.LearnerTimeoutError` names the ranks
  still busy. Under torchrun the agent also ends the other processes when one dies.
- Signals: ranks > 0 ignore SIGINT, and SIGTERM for :data:`SIGTERM_GRACE_S` (torchrun's agent
  forwards a signal to every rank; rank 0 finishes the batch in flight with them, checkpoints
  and tells them to stop). When the agent SIGTERMs rank 0 because another rank died, rank 0
  names that rank (:meth:`TorchrunLearnerGroup.lost_rank`: its heartbeat stopped).
- Shutdown: :meth:`TorchrunLearnerGroup.close` tells the ranks to stop (they leave
  :func:`serve_rank` and their process exits 0) and destroys the process group; a rank whose
  rank 0 is gone sees its connection close and exits 1.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlstruct.errors import BatcherStateError, ConfigError, LearnerError, LearnerTimeoutError
from rlstruct.learners.base import LearnerGroupBase, LearnFn, ModelFactory, OptimizerFactory
from rlstruct.learners.staging import pack, split_rows
from rlstruct.learners.torchrun_ranks import (
    BEAT_S,
    Replica,
    from_bytes,
    join_world,
    local_device,
    serve_rank,
    to_bytes,
    torchrun_rank,
    torchrun_world,
)
from rlstruct.learners.torchrun_ranks import SIGTERM_GRACE_S as SIGTERM_GRACE_S

__all__ = ["TorchrunLearnerGroup", "serve_rank", "torchrun_group", "torchrun_rank",
           "torchrun_world"]


def torchrun_group(
    algo: str, layout: Any, make_model: Callable[[], nn.Module],
    make_optimizer: OptimizerFactory, learn: Callable[..., Any],
    model: nn.Module, device: torch.device,
) -> TorchrunLearnerGroup:
    """``Run.learner_group`` on rank 0 under torchrun: checks the layout (one rank per process,
    on ``cuda:LOCAL_RANK`` or the CPU) and starts the group from ``model``'s weights.

    Raises:
        ConfigError: ``layout.learner_devices`` or a Ray learner backend given, or
            ``layout.n_learners`` neither 1 nor ``WORLD_SIZE``.
    """
    world = torchrun_world()
    if (layout.learner_devices is not None or layout.n_learners not in (1, world)
            or layout.learner_backend != "local"):
        raise ConfigError(
            f"{algo} runs under torchrun (WORLD_SIZE={world}): one rank per process on "
            f"cuda:LOCAL_RANK or the CPU; drop --learner-devices and --learner-backend, and "
            f"--n-learners must be 1 or {world} (got {layout.n_learners})")
    return TorchrunLearnerGroup(make_model, make_optimizer, learn, model.state_dict(), device)


class TorchrunLearnerGroup(LearnerGroupBase):
    """Rank 0's side of a learner group under torchrun (see the module notes); the same driver
    calls as :class:`~rlstruct.learners.group.LearnerGroup`, learning synchronously in this
    process as rank 0 while ranks 1..N-1 (:func:`serve_rank`) learn on their rows.

    Args:
        make_model, make_optimizer, learn, init_state: as for LearnerGroup.
        device: rank 0's learner device (``cpu``, or ``cuda``: every rank on
            ``cuda:LOCAL_RANK``).
        timeout: seconds a batch may take on a rank before :class:`LearnerTimeoutError`.
        start_timeout: seconds for every rank to join.
        bucket_mb: megabytes of gradients per all-reduce bucket.

    Raises:
        ConfigError: not rank 0 of a torchrun world, or a device that is neither cpu nor cuda.
        LearnerTimeoutError: the ranks did not join within ``start_timeout``.
    """

    def __init__(self, make_model: ModelFactory, make_optimizer: OptimizerFactory,
                 learn: LearnFn, init_state: Mapping[str, Tensor],
                 device: str | torch.device = "cpu", *, timeout: float = 300.0,
                 start_timeout: float = 1800.0, bucket_mb: float = 25.0) -> None:
        self.n_learners = torchrun_world()
        device = torch.device(device)
        problems = []
        if self.n_learners < 2 or torchrun_rank() != 0 or device.type not in ("cpu", "cuda"):
            problems.append(
                f"it runs on rank 0 of a torchrun world on cpu or cuda; got "
                f"WORLD_SIZE={self.n_learners}, RANK={os.environ.get('RANK')}, device {device}")
        self._setup("TorchrunLearnerGroup", problems, make_model, make_optimizer, learn,
                    init_state, timeout, start_timeout, bucket_mb)
        self._closed, self._failed = False, False
        self._result: dict[str, float] | None = None
        self._submitted = 0
        init_cpu = {k: v.detach().cpu().clone() for k, v in init_state.items()}
        spec = cloudpickle.dumps((make_model, make_optimizer, learn, init_cpu, device.type,
                                  self.bucket_bytes))
        try:
            self._store, self._control, self._data = join_world(
                0, self.n_learners, local_device(device.type), self.timeout, start_timeout)
        except Exception as err:  # a rank that never came, a port taken...
            raise LearnerTimeoutError(
                f"learner group (torchrun): the {self.n_learners} ranks did not join at "
                f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} within "
                f"{start_timeout:g} s: {err}", ranks=list(range(1, self.n_learners))) from err
        self._replica = Replica(spec, 0, self.n_learners, self._store)
        self.devices = [self._replica.device]
        self._collective(lambda: dist.broadcast_object_list([spec], src=0, group=self._control),
                         "sending the factories", None)

    @property
    def pending(self) -> int:
        """Batches learned but not collected yet (0 or 1)."""
        return int(self._result is not None)

    def submit(self, batch: Any, **kwargs: Any) -> None:
        """Learns on ``batch`` (all ranks, each on its rows) before it returns; :meth:`collect`
        then returns the metrics.

        Raises:
            ShapeError: the rows are not a multiple of the world size.
            BatcherStateError: a batch's metrics were not collected, or the group is closed.
            LearnerError, LearnerTimeoutError: a rank failed or did not answer in time.
        """
        if self._closed or self._failed:
            raise BatcherStateError("the torchrun learner group is closed or failed")
        if self._result is not None:
            raise BatcherStateError("submit: collect() the previous batch first")
        kind, tensors = pack(batch)
        shards = split_rows({k: v.detach() for k, v in tensors.items()}, self.n_learners)
        index = self._submitted
        start = time.perf_counter()
        specs = {k: (tuple(v.shape), v.dtype) for k, v in shards[0].items()}
        header = [("batch", index, kind, specs, kwargs)]
        buffers = [to_bytes(s) for s in shards]
        self._collective(lambda: dist.broadcast_object_list(header, src=0, group=self._control),
                         "receiving a batch header", index)
        mine = torch.empty_like(buffers[0])
        self._collective(lambda: dist.scatter(mine, buffers, src=0, group=self._data),
                         "receiving its rows", index)
        load_ms = (time.perf_counter() - start) * 1e3
        answer = self._collective(lambda: self._replica.step(index, kind,
                                                             from_bytes(mine, specs), kwargs),
                                  "learning", index)
        answers: list[Any] = [None] * self.n_learners
        self._collective(lambda: dist.gather_object(answer, answers, dst=0, group=self._data),
                         "learning", index)
        self._submitted += 1
        self._result = _merge(answers, load_ms)

    def collect(self, timeout: float | None = None) -> dict[str, float]:
        """The metrics of the batch :meth:`submit` learned: the learn function's averaged over
        the ranks, the slowest rank's timings, ``replica_spread`` (largest difference between
        a rank's parameter checksum and rank 0's: 0 when the replicas agree) and
        ``rows_per_rank``.

        Raises:
            BatcherStateError: nothing was submitted.
        """
        if self._result is None:
            raise BatcherStateError("collect: no batch submitted (submit(batch) first)")
        result, self._result = self._result, None
        return result

    def _weights(self) -> dict[str, Tensor]:
        """Rank 0's weights (CPU tensors; copy them to keep them)."""
        return {k: v.detach().cpu() for k, v in self._replica.model.state_dict().items()}

    def _load(self, state: Mapping[str, Tensor] | None, optimizer_state: dict | None) -> None:
        """Rank 0 broadcasts ``state`` and/or ``optimizer_state``; every rank loads them."""
        if state is not None:
            state = {k: v.detach().cpu() for k, v in state.items()}
        if self._closed or self._failed or self._result is not None:
            raise BatcherStateError("load: the torchrun learner group is closed, failed, or "
                                    "has a batch's metrics to collect")
        header = [("load", state, optimizer_state)]
        self._collective(lambda: dist.broadcast_object_list(header, src=0, group=self._control),
                         "receiving a state to load", None)
        self._replica.load(state, optimizer_state)
        self._collective(lambda: dist.barrier(group=self._data), "loading a state", None)

    def optimizer_state_dict(self) -> dict[str, Any]:
        """Rank 0's optimizer state."""
        return self._replica.optimizer.state_dict()

    def close(self, timeout: float = 10.0) -> None:
        """Tells the ranks to stop (unless the group failed) and destroys the process group.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self._failed:
            with contextlib.suppress(Exception):  # ranks gone: torchrun's agent stops them
                dist.broadcast_object_list([("stop",)], src=0, group=self._control)
        if dist.is_initialized():
            with contextlib.suppress(Exception):  # close is idempotent and never raises
                dist.destroy_process_group()

    def _collective(self, fn: Callable[[], Any], what: str, batch: int | None) -> Any:
        """Runs ``fn``; turns a failure into an error naming the rank (read from the store)."""
        try:
            return fn()
        except Exception as exc:
            self._failed = True
            raise self._diagnose(what, batch) from exc
        except BaseException:  # a signal in a collective: the world is out of step
            self._failed = True
            raise

    def lost_rank(self) -> str | None:
        """Why torchrun's agent stopped this rank, when a rank > 0 died or failed: that rank,
        described (its traceback's last line, or its pid and host and that its heartbeat
        stopped: a signal such as SIGKILL, or the OOM killer); None while every rank beats."""
        ranks = range(1, self.n_learners)
        with contextlib.suppress(Exception):  # a store that is gone: the beats below tell
            for r in ranks:
                if self._store.check([f"error/{r}"]):
                    self._failed = True
                    text = self._store.get(f"error/{r}").decode().strip()
                    return (f"LearnerError: learner group (torchrun): rank {r} raised "
                            f"{(text.splitlines() or ['?'])[-1]}; torchrun then stopped rank 0")
            before = self._beats(ranks)
            time.sleep(4 * BEAT_S)
            after = self._beats(ranks)
            for r in ranks:
                if after[r] == before[r]:
                    self._failed = True
                    return (f"LearnerError: learner group (torchrun): rank {r} ({self._pid(r)}) "
                            "died "
                            "without a traceback (its heartbeat stopped: killed by a signal "
                            "such as SIGKILL, or the OOM killer); torchrun then stopped rank 0")
        return None

    def _diagnose(self, what: str, batch: int | None) -> LearnerError | LearnerTimeoutError:
        ranks = range(1, self.n_learners)
        suffix = (f" (batch {batch})" if batch is not None else "") + \
            ". The group is unusable: the run ends"
        for r in ranks:
            with contextlib.suppress(Exception):  # diagnosis only: the next rank, or the beats
                if self._store.check([f"error/{r}"]):
                    text = self._store.get(f"error/{r}").decode()
                    last = text.strip().splitlines()[-1] if text.strip() else "?"
                    return LearnerError(f"learner group (torchrun): rank {r} raised {last} "
                                        f"while {what}{suffix}", rank=r, batch=batch,
                                        exc_type=last.split(":", 1)[0], learner_traceback=text)
        before = self._beats(ranks)
        time.sleep(4 * BEAT_S)
        after = self._beats(ranks)
        for r in ranks:
            if after[r] == before[r]:
                return LearnerError(f"learner group (torchrun): rank {r} ({self._pid(r)}) died "
                                    f"(its heartbeat stopped) while {what}{suffix}", rank=r,
                                    batch=batch)
        phases = {r: self._phase(r) for r in ranks}
        busy = [r for r in ranks if not phases[r].startswith("idle")] or list(ranks)
        described = "; ".join(f"rank {r}: {phases[r]}" for r in busy)
        return LearnerTimeoutError(f"learner group (torchrun): ranks {busy} did not finish "
                                   f"{what} within {self.timeout:g} s ({described}){suffix}",
                                   ranks=busy)

    def _pid(self, rank: int) -> str:
        """``pid N on HOST`` of a rank > 0, as it wrote it to the store."""
        try:
            return "pid " + self._store.get(f"pid/{rank}").decode() if self._store.check(
                [f"pid/{rank}"]) else "pid unknown"
        except Exception:  # noqa: BLE001 - diagnosis of a dying group: the store may be gone
            return "pid unknown"

    def _beats(self, ranks: range) -> dict[int, int]:
        out = {}
        for r in ranks:
            try:
                out[r] = self._store.add(f"beat/{r}", 0)
            except Exception:  # noqa: BLE001 - diagnosis of a dying group: -1, no beat known
                out[r] = -1
        return out

    def _phase(self, rank: int) -> str:
        try:
            return self._store.get(f"phase/{rank}").decode() if self._store.check(
                [f"phase/{rank}"]) else "not started"
        except Exception:  # noqa: BLE001 - diagnosis of a dying group: the store may be gone
            return "unknown"


def _merge(answers: list[tuple], load_ms: float) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for key in answers[0][0]:
        metrics[key] = sum(a[0].get(key, math.nan) for a in answers) / len(answers)
    for key in ("rank_learn_ms", "allreduce_ms"):
        metrics[key] = max(a[1][key] for a in answers)
    metrics["load_wait_ms"] = load_ms
    metrics["n_allreduce"] = answers[0][1]["n_allreduce"]
    metrics["learner_queue"] = 0.0
    metrics["replica_spread"] = max(abs(a[2] - answers[0][2]) for a in answers)
    metrics["rows_per_rank"] = float(min(a[3] for a in answers))
    return metrics

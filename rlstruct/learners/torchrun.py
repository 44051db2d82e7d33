"""The learner group under ``torchrun``: N processes started by torchrun, rank 0 the driver.

``torchrun --nproc-per-node N -m rlstruct.algos.ppo ...`` runs the same job as ``--n-learners N``.
Every
process starts the algorithm's script; :class:`~rlstruct.runs.run.Run` sends the processes with
``RANK > 0`` into :func:`serve_rank` before it creates anything (no run folder, batcher or
evaluator there), so only rank 0 owns the batcher, the logger, the evaluator and the
checkpoints. Rank 0's ``Run.learner_group`` returns a :class:`TorchrunLearnerGroup`, which has
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
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlstruct.errors import BatcherStateError, ConfigError, LearnerError, LearnerTimeoutError
from rlstruct.learners.base import LearnerGroupBase, LearnFn, ModelFactory, OptimizerFactory
from rlstruct.learners.rank import RankContext, _as_metrics
from rlstruct.learners.staging import pack, split_rows, unpack

__all__ = ["TorchrunLearnerGroup", "serve_rank", "torchrun_group", "torchrun_rank",
           "torchrun_world"]

_BEAT_S = 0.25  # heartbeat period of ranks > 0
_ORPHAN_GRACE_S = 2.0  # a rank whose store is gone exits after this, unless it stopped
_IDLE_S = 24 * 3600.0  # how long ranks > 0 wait for rank 0's next batch (it may evaluate...)
#: Seconds a rank > 0 keeps serving after a SIGTERM (rank 0 stops it before; torchrun's agent
#: sends SIGKILL 30 s after its SIGTERM).
SIGTERM_GRACE_S = 25.0


def torchrun_world() -> int:
    """``WORLD_SIZE`` (1 when unset: not under torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def torchrun_rank() -> int:
    """``RANK`` under torchrun (``WORLD_SIZE`` > 1), else 0.

    Raises:
        ConfigError: ``WORLD_SIZE`` > 1 without the other variables torchrun sets.
    """
    if torchrun_world() <= 1:
        return 0
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {missing} are not set: "
                          "start the processes with torchrun (or set all of them)")
    return int(os.environ["RANK"])


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


def _local_device(device_type: str) -> torch.device:
    if device_type == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _join(rank: int, world: int, device: torch.device, timeout: float | None,
          start_timeout: float) -> tuple[Any, Any, Any]:
    """Joins torchrun's world: ``(store, control group, data group)``; the default group
    (NCCL on CUDA, else gloo) carries the gradients. Ranks > 0 wait up to ``start_timeout``
    for rank 0 (which starts its batcher first); collectives then fail after rank 0's
    ``timeout`` (None on ranks > 0: they read it from the store)."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent,
                          timeout=timedelta(seconds=start_timeout))
    if rank == 0:
        store.set("rlstruct/timeout", str(timeout))
    else:
        store.wait(["rlstruct/timeout"], timedelta(seconds=start_timeout))
        timeout = float(store.get("rlstruct/timeout").decode())
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore("rlstruct/pg", store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout))
    control = dist.new_group(backend="gloo", timeout=timedelta(seconds=_IDLE_S))
    data = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
    return dist.PrefixStore("rlstruct/health", store), control, data


def _checksum(model: nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.detach().double().sum().item() for p in model.parameters()))


def _to_bytes(tensors: Mapping[str, Tensor]) -> Tensor:
    return torch.cat([v.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                      for v in tensors.values()])


def _from_bytes(buffer: Tensor, specs: dict[str, tuple[tuple[int, ...], torch.dtype]]
                ) -> dict[str, Tensor]:
    out, start = {}, 0
    for k, (shape, dtype) in specs.items():
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        out[k] = buffer[start:start + n].view(dtype).reshape(shape)
        start += n
    return out


class _Replica:
    """One rank's model, optimizer and context, and its learn step on a received shard."""

    def __init__(self, spec: bytes, rank: int, world: int, store: Any) -> None:
        make_model, make_optimizer, learn, init_state, device_type, bucket = \
            cloudpickle.loads(spec)
        self.device = _local_device(device_type)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.model = make_model().to(self.device)
        self.model.load_state_dict(init_state)
        self.optimizer = make_optimizer(self.model.parameters(), device=self.device)
        self.ctx = RankContext(rank, world, self.device, self.model, self.optimizer,
                               bucket_bytes=bucket)
        self.learn, self.rank, self.store = learn, rank, store

    def load(self, state: Mapping[str, Tensor] | None, optimizer_state: dict | None) -> None:
        """Loads weights and/or an optimizer state (a resume; the same on every rank)."""
        if state is not None:
            self.model.load_state_dict(state)
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)

    def step(self, index: int, kind: str, shard: dict[str, Tensor], kwargs: dict) -> tuple:
        """Learns on the shard; returns ``(metrics, timings, checksum, rows)``."""
        self.store.set(f"phase/{self.rank}", f"learning batch {index}")
        tensors = {k: v.to(self.device, non_blocking=True) for k, v in shard.items()}
        self.ctx.allreduce_ms, self.ctx.n_allreduce = 0.0, 0
        start = time.perf_counter()
        metrics = _as_metrics(self.learn(self.ctx, unpack(kind, tensors), **kwargs))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        timings = {"rank_learn_ms": (time.perf_counter() - start) * 1e3,
                   "allreduce_ms": self.ctx.allreduce_ms,
                   "n_allreduce": float(self.ctx.n_allreduce)}
        self.store.set(f"phase/{self.rank}", f"idle after batch {index}")
        rows = int(next(iter(shard.values())).shape[0])
        return metrics, timings, _checksum(self.model), rows


def serve_rank(device_type: str = "cpu", timeout: float = 1800.0) -> None:
    """The body of a torchrun process with ``RANK > 0``: joins the world, receives the
    algorithm's factories from rank 0, then learns on its rows of every batch rank 0 scatters
    until rank 0 says stop. Exits the process: 0 after stop, 1 after an error (whose traceback
    rank 0 reads from the store).

    Args:
        device_type: the learner device's type, ``cpu`` or ``cuda`` (then ``cuda:LOCAL_RANK``).
        timeout: seconds to wait for rank 0 to create its group (it starts its batcher first).
    """
    rank, world = torchrun_rank(), torchrun_world()
    store = None
    stop = threading.Event()
    code = 0
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: rank 0 decides, then says stop
    signal.signal(signal.SIGTERM, _exit_later)
    try:
        store, control, data = _join(rank, world, _local_device(device_type), None, timeout)
        store.set(f"pid/{rank}", f"{os.getpid()} on {socket.gethostname()}")
        # Its own client with a short timeout: a lost store is noticed in seconds.
        beat_store = dist.PrefixStore("rlstruct/health", dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=timedelta(seconds=_ORPHAN_GRACE_S)))
        beat = threading.Thread(target=_heartbeat, args=(beat_store, rank, stop), daemon=True,
                                name=f"rlstruct-rank{rank}-heartbeat")
        beat.start()
        message: list[Any] = [None]
        dist.broadcast_object_list(message, src=0, group=control)
        replica = _Replica(message[0], rank, world, store)
        while True:
            store.set(f"phase/{rank}", "waiting for a batch")
            header: list[Any] = [None]
            dist.broadcast_object_list(header, src=0, group=control)
            if header[0][0] == "stop":
                break
            if header[0][0] == "load":  # a resume: every rank loads what rank 0 loads
                replica.load(*header[0][1:])
                dist.barrier(group=data)
                continue
            _, index, kind, specs, kwargs = header[0]
            size = sum(math.prod(s) * torch.empty((), dtype=d).element_size()
                       for s, d in specs.values())
            buffer = torch.empty(size, dtype=torch.uint8)
            dist.scatter(buffer, None, src=0, group=data)
            answer = replica.step(index, kind, _from_bytes(buffer, specs), kwargs)
            dist.gather_object(answer, None, dst=0, group=data)
    except BaseException as exc:  # noqa: BLE001 - told to rank 0 and printed; the rank exits 1
        code = 1
        if store is not None:
            with contextlib.suppress(Exception):  # rank 0's store gone: the traceback is printed
                store.set(f"error/{rank}", "".join(traceback.format_exception(exc)))
        traceback.print_exc()
    finally:
        stop.set()
        if dist.is_initialized():
            with contextlib.suppress(Exception):  # a broken group: the exit code says why
                dist.destroy_process_group()
    raise SystemExit(code)


def _exit_later(signum: int, frame: Any) -> None:
    """A rank > 0's SIGTERM: rank 0 (signalled too) finishes its batch with this rank and then
    says stop; should it not, the process ends after :data:`SIGTERM_GRACE_S`."""
    timer = threading.Timer(SIGTERM_GRACE_S, os._exit, args=(128 + signum,))
    timer.daemon = True
    timer.start()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _heartbeat(store: Any, rank: int, stop: threading.Event) -> None:
    """Beats until ``stop``; a rank whose store (rank 0's, or torchrun's agent) is gone ends its
    own process after a grace period, even when its main thread hangs in ``learn``."""
    while not stop.wait(_BEAT_S):
        try:
            store.add(f"beat/{rank}", 1)
        except Exception:  # noqa: BLE001 - the store is gone: this rank is an orphan, it leaves
            if not stop.wait(_ORPHAN_GRACE_S):
                os._exit(1)
            return


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
            self._store, self._control, self._data = _join(
                0, self.n_learners, _local_device(device.type), self.timeout, start_timeout)
        except Exception as err:  # a rank that never came, a port taken...
            raise LearnerTimeoutError(
                f"learner group (torchrun): the {self.n_learners} ranks did not join at "
                f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} within "
                f"{start_timeout:g} s: {err}", ranks=list(range(1, self.n_learners))) from err
        self._replica = _Replica(spec, 0, self.n_learners, self._store)
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
        buffers = [_to_bytes(s) for s in shards]
        self._collective(lambda: dist.broadcast_object_list(header, src=0, group=self._control),
                         "receiving a batch header", index)
        mine = torch.empty_like(buffers[0])
        self._collective(lambda: dist.scatter(mine, buffers, src=0, group=self._data),
                         "receiving its rows", index)
        load_ms = (time.perf_counter() - start) * 1e3
        answer = self._collective(lambda: self._replica.step(index, kind,
                                                             _from_bytes(mine, specs), kwargs),
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
            time.sleep(4 * _BEAT_S)
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
        time.sleep(4 * _BEAT_S)
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

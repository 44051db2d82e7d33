"""rlstruct.learners.group: data-parallel ranks on gloo (CPU) equal one learner on the full batch,
fail loudly and by name, and leave nothing behind; staging and sharding pieces in-process."""

from __future__ import annotations

import os
import threading
import time

import cloudpickle
import psutil
import pytest
import torch
from support import learner_fns
from support.learner_fns import toy_batch, toy_model
from support.processes import children

from rlstruct import DictTensor, TemporalDictTensor, Trajectories
from rlstruct.errors import (
    BatcherStateError,
    ConfigError,
    KeyMismatchError,
    LearnerError,
    LearnerTimeoutError,
    ShapeError,
)
from rlstruct.learners.group import LearnerGroup
from rlstruct.learners.rank import RankContext
from rlstruct.learners.staging import DeviceStager, StagingRing, pack, split_rows, unpack
from rlstruct.runs.resolve import resolve

cloudpickle.register_pickle_by_value(learner_fns)


def group(learn=learner_fns.toy_learn, make_model=toy_model, n_learners=2, model=None, **kw):
    model = model if model is not None else toy_model()
    return LearnerGroup(make_model, learner_fns.adam, learn, model.state_dict(),
                        n_learners=n_learners, devices=["cpu"] * n_learners, **kw)


# ----------------------------------------------------------------------------- in-process pieces
def test_split_rows_gives_equal_views_and_refuses_uneven_batches():
    x = torch.arange(12).view(6, 2)
    shards = split_rows({"x": x, "y": torch.arange(6)}, 3)
    assert [s["y"].tolist() for s in shards] == [[0, 1], [2, 3], [4, 5]]
    assert shards[1]["x"].data_ptr() == x[2].data_ptr()  # views, no copy
    with pytest.raises(ShapeError, match="7 rows cannot be split into 2 equal shards"):
        split_rows({"x": torch.zeros(7)}, 2)
    with pytest.raises(ShapeError, match=r"share their number of rows .*'y': 5"):
        split_rows({"x": torch.zeros(6), "y": torch.zeros(5)}, 2)


def test_pack_unpack_round_trips_trajectories():
    steps = TemporalDictTensor({"r": torch.arange(8.0).view(2, 4)}, torch.tensor([4, 2]))
    traj = Trajectories(DictTensor({"seed": torch.tensor([3, 4])}), steps)
    kind, tensors = pack(traj)
    back = unpack(kind, split_rows(tensors, 2)[1])
    assert isinstance(back, Trajectories) and back.n_elems() == 1
    assert back.trajectories["r"].tolist() == [[4.0, 5.0, 6.0, 7.0]]
    assert back.lengths.tolist() == [2] and back.info["seed"].tolist() == [4]
    with pytest.raises(TypeError, match="DictTensor or Trajectories, got dict"):
        pack({"x": torch.zeros(2)})


def test_staging_ring_checks_keys_and_shapes_and_stages_a_copy():
    ring = StagingRing({"x": torch.zeros(4, 3)}, n_slots=2)
    ring.write(1, {"x": torch.ones(4, 3)})
    staged, event = DeviceStager(torch.device("cpu")).stage(1, ring.slots[1])
    ring.write(1, {"x": torch.zeros(4, 3)})  # the slot is free again: the staged copy stays
    assert event is None and staged["x"].sum() == 12
    with pytest.raises(KeyMismatchError, match=r"missing \['x'\], unexpected \['z'\]"):
        ring.check({"z": torch.zeros(4, 3)})
    with pytest.raises(ShapeError, match=r"shard\['x'\] is \(4, 2\)"):
        ring.check({"x": torch.zeros(4, 2)})


def test_one_rank_step_is_bitwise_gradient_step():
    torch.manual_seed(0)
    a, b, batch = toy_model(), toy_model(), toy_batch()
    b.load_state_dict(a.state_dict())
    learner_fns.toy_reference(a, batch)
    ctx = RankContext(0, 1, torch.device("cpu"), b, learner_fns.adam(b.parameters()))
    learner_fns.toy_learn(ctx, batch)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values()))


def test_config_errors_are_listed_at_once():
    with pytest.raises(ConfigError) as err:
        LearnerGroup(toy_model, learner_fns.adam, "learn", {}, n_learners=2,
                     devices=["cpu"], timeout=-1, backend="mpi")
    text = str(err.value)
    for part in ("learn must be callable", "timeout must be", "init_state must be",
                 "devices names 1 device(s)", "backend must be"):
        assert part in text, part
    with pytest.raises(ConfigError, match="'nccl' needs a CUDA device per rank"):
        group(n_learners=1, backend="nccl")


# ----------------------------------------------------------------------------- ranks (gloo)
def _snapshot() -> dict:
    return {"threads": {t.ident for t in threading.enumerate()},
            "shm": set(os.listdir("/dev/shm"))}


def _assert_nothing_left(before: dict, port: int) -> None:
    assert children() == []
    assert {t.ident for t in threading.enumerate()} <= before["threads"]
    assert set(os.listdir("/dev/shm")) - before["shm"] == set()
    listening = [c for c in psutil.net_connections("tcp")
                 if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN]
    assert listening == []


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["toy", "ppo"])
def test_two_ranks_on_half_rows_equal_one_learner_on_all(kind):
    # PPO with tiny buckets: several all-reduces launched from the backward hooks, in order.
    bucket_mb = 25.0 if kind == "toy" else 1e-3
    make, learn, reference, batch = {
        "toy": (toy_model, learner_fns.toy_learn, learner_fns.toy_reference, toy_batch()),
        "ppo": (learner_fns.ppo_model, learner_fns.ppo_learn, learner_fns.ppo_reference,
                learner_fns.ppo_batch()),
    }[kind]
    torch.manual_seed(0)
    model = make()
    before = _snapshot()
    g = group(learn, make, n_learners=2, model=model, timeout=60, bucket_mb=bucket_mb)
    with g:
        metrics = g.learn(batch)
        weights = {k: v.clone() for k, v in g.state_dict().items()}
        assert g.optimizer_state_dict()["state"][0]["step"] == learner_fns.N_STEPS
    _assert_nothing_left(before, g.address[1])
    assert metrics["n_allreduce"] == learner_fns.N_STEPS and metrics["learner_queue"] == 0
    assert min(metrics["rank_learn_ms"], metrics["allreduce_ms"], metrics["load_wait_ms"]) > 0
    torch.set_num_threads(1)
    reference(model, batch)  # one learner, the full batch, the same 5 steps
    assert _max_diff(weights, model.state_dict()) < 1e-5
    assert _max_diff(weights, make().state_dict()) > 1e-3  # it did learn


@pytest.mark.slow
def test_one_rank_group_is_bitwise_a_single_learner_and_pipelines_batches():
    torch.manual_seed(0)
    model, batches = toy_model(), [toy_batch(seed=s) for s in range(3)]
    with group(n_learners=1, model=model, timeout=60) as g:
        g.submit(batches[0])
        g.submit(batches[1])  # staged while batch 0 is learned
        with pytest.raises(BatcherStateError, match="already in flight"):
            g.submit(batches[2])
        first = g.collect()
        g.submit(batches[2])
        g.collect()
        assert g.collect()["learner_queue"] == 1 and first["rows"] == 64
        weights = g.state_dict()
        torch.set_num_threads(1)
        optimizer = learner_fns.adam(model.parameters())
        for batch in batches:
            learner_fns.toy_reference(model, batch, optimizer=optimizer)
        with pytest.raises(ShapeError, match=r"shard\[.*\] is"):
            g.submit(toy_batch(n=32))
        assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    with pytest.raises(BatcherStateError, match="closed"):
        g.submit(batches[0])


@pytest.mark.slow
def test_a_dropped_group_ends_its_ranks():
    import gc

    g = group(n_learners=1, timeout=60)
    g.learn(toy_batch())
    pids = [p.pid for p in g._procs]
    del g
    gc.collect()  # the finalizer stops, then terminates, the ranks
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in pids)
    assert children() == []



# ----------------------------------------------------------------------------- faults
@pytest.mark.slow
def test_a_rank_killed_mid_update_is_a_learner_error_naming_it():
    before = _snapshot()
    g = group(learner_fns.killed_learn, timeout=60)
    with g:
        g.learn(toy_batch(), index=0)
        start = time.monotonic()
        with pytest.raises(LearnerError, match="rank 1 died with exit code -9") as err:
            g.learn(toy_batch(), index=1)
        assert time.monotonic() - start < 20  # the death is seen at once, not at the deadline
        assert err.value.rank == 1 and err.value.exitcode == -9 and err.value.batch is None
        with pytest.raises(LearnerError, match="rank 1 died"):  # the group stays failed
            g.submit(toy_batch())
        start = time.monotonic()
    assert time.monotonic() - start < 10  # close() is bounded although rank 0 is stuck
    _assert_nothing_left(before, g.address[1])


@pytest.mark.slow
def test_a_rank_that_raises_is_named_with_its_traceback():
    with group(learner_fns.raising_learn, timeout=60) as g, \
            pytest.raises(LearnerError, match="rank 1 raised ValueError: bad reward") as err:
        g.learn(toy_batch())
    assert err.value.rank == 1 and err.value.batch == 0 and err.value.exc_type == "ValueError"
    assert "raising_learn" in err.value.learner_traceback
    assert "Traceback in rank 1" in str(err.value)


@pytest.mark.slow
def test_a_rank_failing_at_start_is_named():
    with group(make_model=learner_fns.failing_model, timeout=60) as g, pytest.raises(
            LearnerError, match=r"rank 1 raised RuntimeError: no checkpoint at weights\.pt while "
                                "starting") as err:
        g.submit(toy_batch())
    assert err.value.rank == 1 and "failing_model" in err.value.learner_traceback


@pytest.mark.slow
def test_a_hung_rank_hits_the_deadline_and_is_named_first():
    before = _snapshot()
    g = group(learner_fns.hanging_learn, timeout=3)
    with g:
        g.submit(toy_batch())
        start = time.monotonic()
        with pytest.raises(LearnerTimeoutError, match="did not finish learning batch 0") as err:
            g.collect()
        assert 2.5 < time.monotonic() - start < 10
        assert err.value.ranks == [1, 0]  # rank 1 is in learn, rank 0 waits in the all-reduce
        assert "rank 1: learn on batch 0" in str(err.value)
        assert "rank 0: all-reduce on batch 0" in str(err.value)
        start = time.monotonic()
    assert time.monotonic() - start < 10
    _assert_nothing_left(before, g.address[1])


# ----------------------------------------------------------------------------- GPU (NCCL)
@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2])
def test_nccl_ranks_on_gpus_match_one_learner(n):
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} GPUs")
    torch.manual_seed(0)
    model, batch = toy_model(), toy_batch()
    devices = [f"cuda:{k}" for k in range(n)]
    with LearnerGroup(toy_model, learner_fns.adam, learner_fns.toy_learn, model.state_dict(),
                      n_learners=n, devices=devices, timeout=120) as g:
        assert g.backend == "nccl"
        metrics = g.learn(batch)
        weights = {k: v.clone() for k, v in g.state_dict().items()}
    assert metrics["n_allreduce"] == (learner_fns.N_STEPS if n > 1 else 0)
    learner_fns.toy_reference(model, batch)  # on the CPU: GPU kernels round differently
    assert _max_diff(weights, model.state_dict()) < 1e-4


@pytest.mark.gpu
def test_staging_copies_on_a_cuda_side_stream():
    device = torch.device("cuda:0")
    ring = StagingRing({"x": torch.zeros(1024, 256)}, n_slots=2)
    ring.write(0, {"x": torch.full((1024, 256), 3.0)})
    stager = DeviceStager(device)
    staged, event = stager.stage(0, ring.slots[0])
    assert event is not None and staged["x"].device == device
    ring.write(0, {"x": torch.zeros(1024, 256)})  # the slot may be reused once stage returns
    stager.ready(staged, event)  # the learner's stream waits for the side stream's copy
    assert float(staged["x"].sum()) == 3.0 * 1024 * 256
    assert stager._stream != torch.cuda.current_stream(device)


# ----------------------------------------------------------------------------- algorithms
def test_layout_refuses_a_device_list_of_the_wrong_length():
    from rlstruct.runs.layout import LayoutConfig

    problems = LayoutConfig(n_learners=0, learner_devices="cpu,cpu").problems()
    assert any("n_learners must be >= 1" in p for p in problems)
    assert any("names 2 device(s)" in p for p in problems)


def test_the_ray_learner_flags_parse_and_every_problem_is_listed(monkeypatch):
    import importlib.util

    import tyro

    from rlstruct.algos import ppo
    from rlstruct.runs.layout import LayoutConfig

    real = importlib.util.find_spec
    # The flags parse the same with or without the ray extra: Ray counts as installed here
    # (CI has it, `make test` does not), then as missing below.
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "ray" else real(name, *a))
    cfg = tyro.cli(ppo.Config, args=["--backend", "ray", "--learner-backend", "ray",
                                     "--n-learners", "2", "--learner-num-gpus", "0.5",
                                     "--learner-resources", "learner", "1"])
    layout = cfg.layout
    assert (layout.learner_backend, layout.learner_num_gpus) == ("ray", 0.5)
    assert layout.learner_resources == {"learner": 1.0}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        resolve(ppo.Config(layout=LayoutConfig(learner_backend="ray", learner_devices="cpu",
                                       learner_num_gpus=-1, learner_resources={"x": -1})))
    for text in ("needs Ray, an optional extra: pip install -e '.[ray]'",
                 "learner_devices places local ranks", "learner_num_gpus must be >= 0",
                 "learner_resources must be >= 0"):
        assert text in str(err.value), text
    problems = LayoutConfig(learner_num_gpus=1).problems()
    assert any("add --learner-backend ray" in p for p in problems)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["a2c", "impala"])
def test_a2c_and_impala_run_with_two_learner_ranks_from_the_command_line(algo, tmp_path):
    from support.algo_runs import check_run_dir, run_algo

    run_dir, _ = run_algo(algo, ["--n-learners", "2", "--max-frames", "1500", "--eval-every",
                                 "0", "--n-processes", "2", "--n-envs", "2"], cwd=tmp_path)
    rows = check_run_dir(run_dir)  # checkpoints hold rank 0's model and optimizer
    learned = [r for r in rows if r.get("n_allreduce") not in (None, "", "nan")]
    assert learned and all(float(r["n_allreduce"]) == 1 for r in learned)  # one step per batch
    assert all(float(r["allreduce_ms"]) > 0 for r in learned)
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    assert state["optimizer"]["state"][0]["step"] >= 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ppo_with_two_learner_ranks_solves_cartpole(tmp_path):
    from rlstruct.algos import ppo
    from rlstruct.runs.layout import LayoutConfig

    cfg = ppo.Config(layout=LayoutConfig(learner_device="cpu", n_learners=2), eval_every=0,
                     max_frames=200_000, time_budget=840, runs_dir=str(tmp_path))
    summary = ppo.main(cfg)
    assert summary["solved"], summary  # the target return, 475 over 20 episodes
    rows = (tmp_path / summary["run_dir"]).joinpath("progress.csv").read_text().splitlines()
    header = rows[0].split(",")
    for column in ("load_wait_ms", "rank_learn_ms", "allreduce_ms", "learner_queue"):
        assert column in header, column


def test_reducer_reduces_buckets_during_backward_in_order(monkeypatch):
    from rlstruct.learners import rank as learner_rank

    launched: list[int] = []

    class Done:
        def wait(self) -> None:
            pass

    def fake_all_reduce(flat, async_op):  # a world of 2 whose peer sent the same gradients
        launched.append(flat.numel())
        flat.mul_(2)
        return Done()

    monkeypatch.setattr(learner_rank.dist, "all_reduce", fake_all_reduce)
    torch.manual_seed(0)
    model, batch = toy_model(), toy_batch()
    reference = toy_model()
    reference.load_state_dict(model.state_dict())
    ctx = RankContext(0, 2, torch.device("cpu"), model, learner_fns.adam(model.parameters()),
                      bucket_bytes=1)  # one parameter per bucket
    ctx._reducer.arm()
    learner_fns.toy_loss(model, batch).backward()
    assert launched == [1, 16, 16, 16 * 8]  # during backward, last layer first, in order
    ctx.average_gradients()
    learner_fns.toy_loss(reference, batch).backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)  # (2 g) / 2 == g
    assert ctx.n_allreduce == 1 and launched == [1, 16, 16, 16 * 8]


def test_torchrun_variables_and_layout_are_checked(monkeypatch, tmp_path):
    from rlstruct.algos import ppo
    from rlstruct.runs.layout import LayoutConfig

    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    cfg = ppo.Config(layout=LayoutConfig(learner_device="cpu", n_processes=1, n_envs=2),
                     eval_every=0, runs_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"WORLD_SIZE=2 but \['RANK', 'MASTER_ADDR', "
                                          r"'MASTER_PORT'\] are not set"):
        ppo.main(cfg)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")  # never reached: the layout is refused first
    cfg.layout = LayoutConfig(learner_device="cpu", n_processes=1, n_envs=2, n_learners=3)
    with pytest.raises(ConfigError, match=r"torchrun \(WORLD_SIZE=2\).*--n-learners must be 1 "
                                          r"or 2 \(got 3\)"):
        ppo.main(cfg)

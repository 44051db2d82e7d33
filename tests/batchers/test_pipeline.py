"""Shared-memory weights and pipelined collection (issue 11, sections 1 and 2)."""

from __future__ import annotations

import time

import pytest
import torch
from support.batcher_helpers import counter_env
from torch import nn

from rlstruct.agent import Agent
from rlstruct.batchers import Batcher
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.gym import GymEnvInf
from rlstruct.errors import BatcherStateError, KeyMismatchError, ShapeError, WorkerError
from rlstruct.parallel.weights import SharedWeights, is_state_dict

pytestmark = pytest.mark.timeout(120)


class SamplingAgent(Agent):
    """Linear policy over the counter frame, actions sampled from torch's global generator."""

    def __init__(self) -> None:
        self.model = nn.Linear(3, 3)

    def __call__(self, state, observation, agent_info):
        logits = self.model(observation["frame"].float() / 10)
        action = torch.distributions.Categorical(logits=logits).sample()
        w0 = self.model.weight[0, 0].expand(len(action))
        return DictTensor({"action": action, "w0": w0}), state


def long_counter(n_envs: int, seed: int) -> GymEnvInf:
    return counter_env(n_envs, seed, auto_reset=True, episode_length=1000, n_actions=3)




def learner_weights(i: int) -> dict[str, torch.Tensor]:
    """The weights a deterministic fake learner publishes at its i-th update."""
    g = torch.Generator().manual_seed(i)
    return {"weight": torch.randn(3, 3, generator=g), "bias": torch.randn(3, generator=g)}


def batcher(pipeline: int = 1, **kw) -> Batcher:
    return Batcher(8, SamplingAgent, {}, long_counter, {"n_envs": 2}, n_processes=2, seeds=4,
                   pipeline=pipeline, **kw)


# ---------------------------------------------------------------------------- weights
def test_shared_weights_ring_round_trip_and_checks():
    sd = learner_weights(0)
    ring = SharedWeights(sd, 3)
    assert ring.slots[0]["weight"].is_shared() and ring.n_slots == 3
    staging = ring.staging()
    for v in (1, 2, 3, 4):
        ring.write(v, learner_weights(v))
    for v in (2, 3, 4):  # the last n_slots versions are all readable
        ring.read_into(v, staging)
        assert torch.equal(staging["bias"], learner_weights(v)["bias"])
    with pytest.raises(RuntimeError, match="not in its slot"):
        ring.read_into(1, staging)  # overwritten by version 4
    with pytest.raises(KeyMismatchError, match=r"missing \['bias'\]"):
        ring.check({"weight": sd["weight"]})
    with pytest.raises(ShapeError, match=r"state_dict\['bias'\] is \(4,\)"):
        ring.check({**sd, "bias": torch.zeros(4)})
    with pytest.raises(ShapeError, match=r"torch\.float64"):
        ring.check({**sd, "bias": sd["bias"].double()})
    assert is_state_dict(sd) and not is_state_dict({}) and not is_state_dict({"a": 1})


@pytest.mark.slow
def test_update_with_other_keys_or_shapes_raises_naming_the_key():
    with batcher() as b:
        b.update(learner_weights(0))
        with pytest.raises(KeyMismatchError, match=r"unexpected.*'extra'"):
            b.update({**learner_weights(1), "extra": torch.zeros(1)})
        with pytest.raises(ShapeError, match=r"'weight'"):
            b.update({**learner_weights(1), "weight": torch.zeros(2, 3)})
        assert b.version == 1  # refused updates do not count


@pytest.mark.slow
def test_update_returns_without_waiting_for_busy_workers():
    env_args = {"n_envs": 2, "auto_reset": True, "hang_at": (0, 1), "hang_seconds": 2}
    with Batcher(4, SamplingAgent, {}, counter_env, {**env_args, "n_actions": 3},
                 n_processes=2) as b:
        b.reset()
        b.execute()  # the workers sleep 2 s in this segment
        start = time.monotonic()
        for i in range(5):  # more updates than the ring holds: none needed by a segment
            b.update(learner_weights(i))
        assert time.monotonic() - start < 1.0
        batch, _ = b.get()
        assert batch.info["policy_version"].tolist() == [0] * 4  # started before the updates
        b.execute()
        batch, _ = b.get()
        assert batch.info["policy_version"].tolist() == [5] * 4
        w0 = batch.trajectories["action/w0"]
        assert torch.equal(w0, torch.full_like(w0, float(learner_weights(4)["weight"][0, 0])))


# ---------------------------------------------------------------------------- pipeline
def run_pipelined(k: int, n_batches: int) -> list:
    with batcher(pipeline=k) as b:
        b.reset()
        b.execute()
        out = []
        for i in range(n_batches):
            batch, _ = b.get()
            out.append(batch)
            b.update(learner_weights(i + 1))
        return out


def run_sync_with_one_update_of_lag(n_batches: int) -> list:
    """The synchronous API, collecting batch i+1 before the update learnt from batch i."""
    with batcher() as b:
        b.reset()
        b.execute()
        out = []
        for i in range(n_batches):
            batch, _ = b.get()
            out.append(batch)
            b.execute()  # next segment with the current weights
            b.update(learner_weights(i + 1))
        b.get()
        return out


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.trajectories.equal(y.trajectories) and x.info.equal(y.info)


@pytest.mark.slow
def test_pipelined_data_depend_on_seeds_and_calls_not_on_timing():
    assert_same(run_pipelined(2, 6), run_pipelined(2, 6))


@pytest.mark.slow
def test_pipeline_of_two_equals_the_synchronous_loop_with_one_update_of_lag():
    assert_same(run_pipelined(2, 5), run_sync_with_one_update_of_lag(5))


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 3])
def test_policy_lag_is_k_minus_one_updates(k):
    batches = run_pipelined(k, 7)
    versions = [int(b.info["policy_version"].unique()) for b in batches]
    assert versions == [max(0, j - k + 1) for j in range(7)]
    steps = [int(b.trajectories["observation/env_step"][0, 0]) for b in batches]
    assert steps == [8 * j for j in range(7)]  # segments follow each other, none lost


@pytest.mark.slow
def test_workers_stop_k_segments_ahead_of_a_learner_that_does_not_ask():
    with batcher(pipeline=3) as b:
        b.reset()
        b.execute()
        time.sleep(1.0)  # plenty for many more segments
        b._pump(lambda: True, lambda: time.monotonic() + 5, "test")  # read what they sent
        assert b._released == 3 and sorted(b._done) == [0, 1, 2] and not any(b._inflight)
        for _ in range(3):
            b.get()
        time.sleep(0.3)
        assert b._released == 5  # gets 2 and 3 each owed (then released) one more segment


@pytest.mark.slow
def test_pipelined_call_order_and_reset():
    with batcher(pipeline=2) as b:
        b.reset()
        b.execute()
        with pytest.raises(BatcherStateError, match="streaming"):
            b.execute()
        first, _ = b.get()
        b.reset()  # drains the segment in flight, resets the envs
        with pytest.raises(BatcherStateError, match="execute"):
            b.get()
        b.execute()
        again, _ = b.get()
        assert int(again.trajectories["observation/env_step"][0, 0]) == 0
        assert not again.trajectories.equal(first.trajectories)  # envs continue their RNG


@pytest.mark.slow
def test_a_worker_error_in_the_stream_surfaces_at_get_with_worker_env_step():
    env_args = {"n_envs": 2, "auto_reset": True, "fail_at": (0, 13), "n_actions": 3,
                "episode_length": 100}
    with Batcher(4, SamplingAgent, {}, counter_env, env_args, n_processes=2, pipeline=2) as b:
        b.reset()
        b.execute()
        with pytest.raises(WorkerError) as info:
            for _ in range(10):
                b.get()
        err = info.value
        # Every env fails at t=13 (segment 3, step 0); the first report names its own env.
        assert err.worker in (0, 1) and err.env == 2 * err.worker and err.step == 0
        assert "injected failure" in str(err)


# ---------------------------------------------------------------------------- get(device=...)
@pytest.mark.slow
def test_get_to_another_device_returns_the_same_batch_there():
    with batcher() as a, batcher() as b:
        for x in (a, b):
            x.reset()
            x.execute()
        here, _ = a.get()
        there, _ = b.get(device="meta")  # "another device" on a CPU-only machine
        assert there.trajectories.device() == torch.device("meta")
        assert there.trajectories.lengths.shape == here.trajectories.lengths.shape
        assert there.info["policy_version"].device == torch.device("meta")
        assert sorted(there.trajectories.keys()) == sorted(here.trajectories.keys())


@pytest.mark.gpu
def test_get_to_a_gpu_copies_from_the_pinned_buffer():
    with batcher() as a, batcher() as b:
        for x in (a, b):
            x.reset()
            x.execute()
        here, _ = a.get()
        there, _ = b.get(device="cuda")
        assert b.buffers[0]._pinned is True
        assert there.trajectories.device().type == "cuda"
        assert there.to("cpu").trajectories.equal(here.trajectories)
        assert there.to("cpu").info.equal(here.info)

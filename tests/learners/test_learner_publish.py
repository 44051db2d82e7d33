"""Direct publication: a learner group's rank 0 writes its weights straight into a process
Batcher's shared ring (``Batcher.reserve_weights``, ``SharedWeights.reserve``/``commit``);
``batcher.update(group.state_dict())`` checks and commits the slot without a copy, the workers
act with bitwise those weights, versions advance as before, and nothing is left behind."""

from __future__ import annotations

import itertools
import os

import cloudpickle
import pytest
import torch
from support import learner_fns
from support.agents import MLPAgent
from support.batcher_helpers import counter_env
from support.processes import children

from rlstruct import Batcher, DictTensor
from rlstruct import keys as K
from rlstruct.errors import NonFiniteError
from rlstruct.learners.group import LearnerGroup
from rlstruct.parallel.weights import SharedWeights

cloudpickle.register_pickle_by_value(learner_fns)


def _batch(seed: int) -> DictTensor:
    g = torch.Generator().manual_seed(seed)
    return DictTensor({"x": torch.randn(16, 3, generator=g), "y": torch.randn(16, 3, generator=g)})


def test_a_reserved_slot_is_hidden_until_committed():
    ring = SharedWeights({"w": torch.zeros(3)}, n_slots=2)
    ring.write(0, {"w": torch.ones(3)})
    slot = ring.reserve(1)
    assert int(ring.tags[1]) == -1 and ring.is_slot(1, slot) and not ring.is_slot(0, slot)
    slot["w"].fill_(7.0)  # a writer fills it in place
    with pytest.raises(RuntimeError, match="not in its slot"):
        ring.read_into(1, ring.staging())
    ring.commit(1)
    staged = ring.staging()
    ring.read_into(1, staged)
    assert staged["w"].tolist() == [7.0] * 3


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_rank_0_writes_straight_into_the_batchers_ring():
    before = set(os.listdir("/dev/shm"))
    agent = MLPAgent(obs_dim=3, n_actions=3, hidden=16)
    reference = learner_fns.mlp_model()
    reference.load_state_dict(agent.model.state_dict())
    envs = {"n_envs": 2, "n_actions": 3, "auto_reset": True}
    with Batcher(4, MLPAgent, {}, counter_env, envs, n_processes=2, seeds=0) as batcher, \
            LearnerGroup(learner_fns.mlp_model, learner_fns.adam, learner_fns.mlp_learn,
                         reference.state_dict(), n_learners=2, devices=["cpu", "cpu"],
                         timeout=60) as group:
        assert group.publish_to(batcher)
        batcher.reset()
        batcher.update(reference.state_dict())  # the first update allocates the ring: a copy
        ring = batcher._weights
        optimizer = learner_fns.adam(reference.parameters())
        torch.set_num_threads(1)
        for step in range(3):
            batcher.execute()
            batcher.get()
            version = batcher.version
            group.learn(_batch(step))
            learner_fns.mlp_reference(reference, _batch(step), optimizer)
            slot = (version + 1) % ring.n_slots
            assert group.state_dict() is ring.slots[slot]  # rank 0 wrote there
            assert int(ring.tags[slot]) == -1  # reserved: no worker reads it yet
            batcher.update(group.state_dict())  # checked, then committed without a copy
            assert batcher.version == version + 1 and int(ring.tags[slot]) == version + 1
        batcher.execute()
        traj, _ = batcher.get()
        assert traj.info["policy_version"].tolist() == [batcher.version] * 4  # 2 x 2 envs
        weights = {k: v.clone() for k, v in group.state_dict().items()}
        for k, v in reference.state_dict().items():  # 2 ranks equal 1 learner on all the rows
            assert torch.allclose(weights[k], v, rtol=0, atol=1e-5), k
        agent.model.load_state_dict(weights)
        logits = traj.trajectories["action/logits"]
        frames = traj.trajectories[K.OBS_FRAME].float()
        with torch.no_grad():  # the workers acted with bitwise these weights (per worker, step)
            for w, t in itertools.product(range(2), range(4)):
                rows = slice(2 * w, 2 * w + 2)
                assert torch.equal(agent.model(frames[rows, t]), logits[rows, t]), (w, t)
        # The batcher's checks hold as before: NaN written in the slot is refused.
        batcher.execute()
        batcher.get()
        group.learn(_batch(5))
        group.state_dict()["0.bias"][0] = float("nan")
        with pytest.raises(NonFiniteError, match=r"0\.bias"):
            batcher.update(group.state_dict())
        assert batcher.version == version + 1
    assert children() == [] and set(os.listdir("/dev/shm")) - before == set()

"""Weights handed to a batcher (issue 18, section 5): ``update`` from two threads at once counts
every version exactly and never corrupts a pipe; non-finite weights are refused, naming the key,
unless the caller opts out.
"""

from __future__ import annotations

import threading

import cloudpickle
import pytest
import torch
from support import agents, batcher_helpers
from support.batcher_helpers import GreedyMLPAgent, counter_env

from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.errors import NonFiniteError

cloudpickle.register_pickle_by_value(agents)
cloudpickle.register_pickle_by_value(batcher_helpers)

pytestmark = pytest.mark.timeout(120)

N_UPDATES = 200
ENV_ARGS = {"n_envs": 2, "n_actions": 3, "auto_reset": True}


def weights(value: float) -> dict[str, torch.Tensor]:
    """GreedyMLPAgent's state_dict with every weight equal to ``value``."""
    return {"weight": torch.full((3, 3), value), "bias": torch.zeros(3)}


def make(kind: str):
    args = (4, GreedyMLPAgent, {"n_actions": 3}, counter_env, ENV_ARGS)
    if kind == "serial":
        return SerialBatcher(*args, seeds=1)
    return Batcher(*args, n_processes=2, seeds=1, timeout=60.0)


def hammer(batcher, base: float, errors: list[BaseException]) -> None:
    try:
        for i in range(N_UPDATES):
            batcher.update(weights(base + i))
    except BaseException as e:  # noqa: BLE001 - handed to the main thread, which re-raises it
        errors.append(e)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["serial", "processes"])
def test_two_threads_updating_at_once_count_every_version(kind):
    """2 threads x 200 updates while the main thread collects: no error, no hang, version 400,
    and the next batch is collected with version 400 and the last weights one thread wrote."""
    with make(kind) as batcher:
        batcher.reset()
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=hammer, args=(batcher, base, errors)) for base in (0.0, 1000.0)
        ]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            batcher.execute()
            batch, _ = batcher.get()
            versions = batch.info["policy_version"]
            assert versions.min() == versions.max()  # one version per batch
        for t in threads:
            t.join(timeout=60)
        if errors:
            raise errors[0]
        assert batcher.version == 2 * N_UPDATES
        batcher.execute()
        batch, _ = batcher.get()
        assert batch.info["policy_version"].tolist() == [2 * N_UPDATES] * batch.n_elems()
        # Every logit is weight * (frame sum) + 0: the weight of the last update that won.
        logits = batch.trajectories["action/logits"][..., 0]
        frame_sum = batch.trajectories["observation/frame"].float().sum(-1)
        seen = logits[frame_sum > 0] / frame_sum[frame_sum > 0]
        assert seen.numel() > 0
        last = [N_UPDATES - 1.0, 1000.0 + N_UPDATES - 1]
        assert any(torch.allclose(seen, torch.full_like(seen, v)) for v in last), seen[:4]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_refused_naming_the_key(bad):
    with make("serial") as batcher:
        sd = weights(0.5)
        sd["bias"][1] = bad
        with pytest.raises(NonFiniteError, match=r"key\(s\) \['bias'\]"):
            batcher.update(sd)
        assert batcher.version == 0  # nothing was published
        batcher.update(sd, check_finite=False)  # the opt-out, for speed
        assert batcher.version == 1


@pytest.mark.slow
def test_a_batcher_refuses_non_finite_weights_before_any_worker_sees_them():
    with make("processes") as batcher:
        batcher.reset()
        batcher.update(weights(0.5))
        sd = weights(torch.nan)
        with pytest.raises(NonFiniteError, match=r"\['weight'\]"):
            batcher.update(sd)
        batcher.execute()
        batch, _ = batcher.get()  # the workers still act with version 1
        assert batch.info["policy_version"].tolist() == [1] * batch.n_elems()
        assert not torch.isnan(batch.trajectories["action/logits"]).any()


def test_the_finite_check_names_every_bad_key_of_any_dtype_and_never_a_large_finite_one():
    """The fast path sums each tensor; a sum that overflows (huge but finite weights) is checked
    element by element and accepted."""
    from rlstruct.parallel.weights import check_finite

    fine = {
        "huge": torch.full((4,), 3e38),  # its sum is inf in float32
        "half": torch.ones(2, dtype=torch.float16),
        "steps": torch.arange(3),  # integers are never checked
    }
    check_finite(fine)
    broken = {
        **fine,
        "half": torch.tensor([1.0, float("nan")], dtype=torch.float16),
        "z": torch.tensor([complex(float("inf"), 0.0)]),
    }
    with pytest.raises(NonFiniteError, match=r"key\(s\) \['half', 'z'\]"):
        check_finite(broken)


class KeepingAgent(GreedyMLPAgent):
    """Keeps the very mapping ``update`` is given (an agent that aliases what it receives)."""

    def update(self, info):
        self.kept = info
        super().update(info)


def test_a_serial_batcher_hands_the_agent_copies_of_the_weights_not_the_learners_tensors():
    # SerialBatcher.update copies a state_dict tensor by tensor (no serialisation): the agent
    # must still never alias the learner's tensors, nor carry their autograd graph.
    batcher = SerialBatcher(4, KeepingAgent, {"n_actions": 3}, counter_env, ENV_ARGS, seeds=1)
    with batcher:
        learner = {"weight": torch.full((3, 3), 2.0, requires_grad=True), "bias": torch.zeros(3)}
        batcher.update(learner)
        kept = batcher.agent.kept
        assert set(kept) == {"weight", "bias"} and kept is not learner
        with torch.no_grad():
            learner["weight"].fill_(7.0)
            learner["bias"].fill_(1.0)
        assert torch.equal(kept["weight"], torch.full((3, 3), 2.0))
        assert torch.equal(kept["bias"], torch.zeros(3))
        assert not kept["weight"].requires_grad and kept["weight"].device.type == "cpu"

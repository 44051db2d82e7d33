"""One recurrent agent (RecurrentAgent over the zoo's mlp-lstm, rlstruct.blocks.recurrent) on
rlstruct/CartPoleNoVel-v1 gives bit-equal trajectories from every batcher: SerialBatcher and a
one-process Batcher; a two-process Batcher and a two-actor RayBatcher (skipped without Ray).
Every key is compared over several consecutive segments, the stored state at each segment's
start (``agent_state/h``) and the state after each step (``action/h``) included, with a weight
update in between."""

from __future__ import annotations

import pytest
import torch
from gymnasium import spaces

from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.recurrent import RecurrentAgent
from rlstruct.blocks.zoo import actor_critic
from rlstruct.envs import CARTPOLE_NOVEL_ID, GymEnvInf

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("one_torch_thread")]

T = 24
SEGMENTS = 4
SEED = 7
#: Seconds any start, segment or reset may take before the batcher reports its workers hung.
LIMITS = {"timeout": 60.0, "start_timeout": 120.0}


def make_agent(hidden: int = 16) -> RecurrentAgent:
    return RecurrentAgent(actor_critic("mlp-lstm", (2,), space_spec(spaces.Discrete(2)), hidden))


def novel_env(n_envs: int, seed: int) -> GymEnvInf:
    return GymEnvInf(CARTPOLE_NOVEL_ID, n_envs=n_envs, seed=seed)


def new_weights() -> dict[str, torch.Tensor]:
    """Another policy's weights (pushed to every batcher between two segments)."""
    torch.manual_seed(123)
    return make_agent().model.state_dict()


def segments(batcher) -> list:
    """``SEGMENTS`` consecutive segments (one reset first; new weights before the third)."""
    out = []
    with batcher:
        batcher.reset()
        for i in range(SEGMENTS):
            if i == 2:
                batcher.update(new_weights())
            batcher.execute()
            traj, n_running = batcher.get()
            assert n_running == traj.n_elems()  # auto-reset envs: every row runs on
            out.append(traj)
    return out


def assert_bit_equal(xs: list, ys: list) -> None:
    assert len(xs) == len(ys) == SEGMENTS
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        assert x.lengths.tolist() == y.lengths.tolist() == [T] * x.n_elems()
        for what, a, b in (("info", x.info, y.info), ("steps", x.trajectories, y.trajectories)):
            assert sorted(a.keys()) == sorted(b.keys()), (i, what)
            for k in a:
                assert a[k].dtype == b[k].dtype, (i, k)
                assert torch.equal(a[k], b[k]), f"segment {i}: {what} {k} differs"
    steps = xs[-1].trajectories
    assert {"action/h", "action/logp", "action/value"} <= set(steps.keys())
    assert "agent_state/h" in xs[-1].info
    # What was compared holds what makes the test able to fail: episodes that restart inside
    # a segment, a memory carried over from the previous segment, and a policy that samples.
    assert bool(torch.cat([s.trajectories["observation/initial_state"][:, 1:] for s in xs]).any())
    assert bool(xs[-1].info["agent_state/h"].abs().sum() > 0)
    assert len(torch.unique(steps["action/action"])) == 2


def test_serial_batcher_and_a_one_process_batcher_collect_the_same_recurrent_trajectories():
    args = (T, make_agent, {}, novel_env, {"n_envs": 4})
    serial = segments(SerialBatcher(*args, seeds=SEED))
    workers = segments(Batcher(*args, seeds=SEED, n_processes=1, **LIMITS))
    assert_bit_equal(serial, workers)


@pytest.mark.slow  # a local Ray cluster starts and stops: about 20 s
def test_two_process_batcher_and_two_ray_actors_collect_the_same_recurrent_trajectories():
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]'): "
                                      "the RayBatcher half of the comparison cannot run")
    from rlstruct.batchers import RayBatcher

    args = (T, make_agent, {}, novel_env, {"n_envs": 2})
    workers = segments(Batcher(*args, seeds=SEED, n_processes=2, **LIMITS))
    actors = segments(RayBatcher(*args, seeds=SEED, n_processes=2, **LIMITS))
    assert_bit_equal(workers, actors)
    # The two workers act with their own random streams: their rows differ.
    h = workers[-1].trajectories["action/h"]
    assert not torch.equal(h[:2], h[2:])

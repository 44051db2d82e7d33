"""Batcher behaviour: usage modes, Serial == multi-process, seeds, agent_info, updates, call order.

The counter env's observation is ``[env_id, episode, t]`` with ``env_id`` the GLOBAL env index,
so every assertion below can say exactly which env, episode and step a row must hold.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from support import agents, batcher_helpers
from support.agents import DeterministicAgent, RecurrentAgent
from support.batcher_helpers import GreedyMLPAgent, InfoAgent, counter_env

from rlstruct import keys as K
from rlstruct.agent_replay import replay_agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.batchers.seeding import SEED_BLOCK, env_seed_bases
from rlstruct.dicttensor import DictTensor
from rlstruct.errors import BatcherStateError, ConfigError

# Test helpers live in tests/, which spawned workers cannot import: send them by value.

pytestmark = pytest.mark.timeout(120)


def episode_length(env_id: int, episode: int) -> int:
    return 2 + (env_id + episode) % 4


def make(kind: str, n_processes: int, n_envs: int, t: int, **kw):
    """A batcher of ``n_processes * n_envs`` counter envs (all in one VecEnv when serial)."""
    if kind == "serial":
        n_envs *= n_processes
    env_args = {
        "n_envs": n_envs,
        "episode_length": episode_length,
        "n_actions": 3,
        **kw.pop("env_args", {}),
    }
    common = dict(
        n_timesteps=t,
        create_agent=kw.pop("create_agent", DeterministicAgent),
        agent_args=kw.pop("agent_args", {"n_actions": 3}),
        create_env=counter_env,
        env_args=env_args,
        seeds=kw.pop("seeds", 3),
        **kw,
    )
    if kind == "serial":
        return SerialBatcher(**common)
    return Batcher(n_processes=n_processes, **common)


def frames(traj):
    return traj.trajectories["observation/frame"], traj.trajectories["_observation/frame"]


def test_full_episodes_mode():
    with make("serial", 1, 6, 10) as b:
        b.reset()
        b.execute()
        traj, n_running = b.get()
    assert n_running == 0
    env_ids = traj.info[K.ENV_ID].tolist()
    assert env_ids == list(range(6))
    expected = torch.tensor([episode_length(g, 0) for g in env_ids])
    assert torch.equal(traj.lengths, expected)
    assert traj.trajectories.n_timesteps() == int(expected.max())  # shortened to the longest row
    obs, nxt = frames(traj)
    for row, g in enumerate(env_ids):
        length = int(expected[row])
        assert obs[row, :length].tolist() == [[g, 0, t] for t in range(length)]
        # The last transition holds the TRUE final observation, never a reset one.
        assert nxt[row, length - 1].tolist() == [g, 0, length]
        done = traj.trajectories["_observation/terminated"][row, :length]
        assert done.tolist() == [False] * (length - 1) + [True]


@pytest.mark.parametrize("kind", ["serial", "multi"])
def test_chunks_of_episodes_drop_finished_rows(kind):
    with make(kind, 2, 3, 2) as b:
        b.reset()
        seen = {g: [] for g in range(6)}
        rows_per_segment = []
        n_running = None
        while n_running != 0:
            b.execute()
            traj, n_running = b.get()
            rows_per_segment.append(traj.n_elems())
            obs, _ = frames(traj)
            for row, g in enumerate(traj.info[K.ENV_ID].tolist()):
                seen[g] += [tuple(x) for x in obs[row, : int(traj.lengths[row])].tolist()]
        with pytest.raises(BatcherStateError, match="no env is running"):
            b.execute()
    for g, steps in seen.items():
        assert steps == [(g, 0, t) for t in range(episode_length(g, 0))]
    assert rows_per_segment[0] == 6 and rows_per_segment[-1] < 6


def test_chunks_carry_the_agent_state_at_segment_start():
    with make(
        "serial",
        1,
        4,
        3,
        create_agent=RecurrentAgent,
        agent_args={"n_actions": 3},
        env_args={"auto_reset": True},
    ) as b:
        b.reset()
        b.execute()
        first, _ = b.get()
        b.execute()
        second, _ = b.get()
    assert torch.equal(first.info["agent_state/h"], torch.zeros_like(first.info["agent_state/h"]))
    assert not torch.equal(second.info["agent_state/h"], first.info["agent_state/h"])
    # Replaying the second segment from its stored state reproduces the collected actions.
    agent = RecurrentAgent(n_actions=3)
    replayed = replay_agent(agent, second)
    assert torch.equal(replayed["action"], second.trajectories["action/action"])


@pytest.mark.parametrize("kind", ["serial", "multi"])
def test_infinite_segments_are_full_and_continue(kind):
    with make(kind, 2, 2, 5, env_args={"auto_reset": True}) as b:
        b.reset()
        last_next = None
        for _ in range(3):
            b.execute()
            traj, n_running = b.get()
            assert n_running == 4
            assert traj.n_elems() == 4 and traj.trajectories.full()
            assert traj.trajectories.n_timesteps() == 5
            obs, nxt = frames(traj)
            if last_next is not None:
                # The first observation of a segment is what the last step led to (or a reset).
                reset = traj.trajectories["observation/initial_state"][:, 0]
                cont = ~reset
                assert torch.equal(obs[cont, 0], last_next[cont])
                assert (obs[reset, 0, 2] == 0).all()
            done = traj.trajectories["_observation/done"]
            last_next = torch.where(
                done[:, -1:].expand(-1, 3), torch.full_like(nxt[:, -1], -1), nxt[:, -1]
            )
            # After a done, the next observation starts a new episode at t=0.
            after = done[:, :-1]
            assert (obs[:, 1:][after][:, 2] == 0).all()
            assert (obs[:, 1:][after][:, 1] == nxt[:, :-1][after][:, 1] + 1).all()


@pytest.mark.parametrize(
    ("n_processes", "agent"),
    [(1, "deterministic"), (2, "deterministic"), (4, "deterministic"), (2, "mlp")],
)
def test_serial_equals_multiprocess(n_processes, agent):
    """R24: the serial path is the reference; the multi-process path returns the same batches
    (exactly for a deterministic agent; within 1e-6 for a neural network agent)."""
    total, t = 8, 3
    kw = {"env_args": {"auto_reset": True}}
    if agent == "mlp":
        kw.update(create_agent=GreedyMLPAgent, agent_args={"n_actions": 3})
    serial = make("serial", 1, total, t, **kw)
    assert serial.n_elems() == total
    multi = make("multi", n_processes, total // n_processes, t, **kw)
    tol = 1e-6 if agent == "mlp" else 0.0
    with serial, multi:
        serial.reset()
        multi.reset()
        if agent == "mlp":  # the same weights everywhere (each process built its own model)
            weights = torch.nn.Linear(3, 3).state_dict()
            serial.update(weights)
            multi.update(weights)
        for _ in range(3):
            serial.execute()
            multi.execute()
            a, na = serial.get()
            b, nb = multi.get()
            assert na == nb
            assert a.info.equal(b.info)
            assert a.trajectories.equal(b.trajectories, rtol=tol, atol=tol)
            assert a.trajectories.keys() == b.trajectories.keys()


def test_non_blocking_get_returns_none_until_ready():
    env_args = {"auto_reset": True, "hang_at": (0, 1), "hang_seconds": 1.0}
    with make("multi", 1, 2, 3, env_args=env_args) as b:
        b.reset()
        b.execute()
        assert b.get(blocking=False) == (None, None)
        deadline = time.monotonic() + 30
        while (result := b.get(blocking=False)) == (None, None):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        traj, n_running = result
        assert traj.n_elems() == 2 and n_running == 2
        with pytest.raises(BatcherStateError, match="call execute"):
            b.get(blocking=False)


@pytest.mark.parametrize("kind", ["serial", "multi"])
def test_execute_agent_info_changes_rows(kind):
    example = DictTensor({"a": torch.zeros(1, dtype=torch.long)})
    with make(
        kind,
        2,
        2,
        2,
        create_agent=InfoAgent,
        agent_args={},
        agent_info=example,
        env_args={"auto_reset": True},
    ) as b:
        b.reset()
        b.execute()
        traj, _ = b.get()
        assert (traj.trajectories["action/action"] == 0).all()
        new = DictTensor({"a": torch.tensor([2, 1, 0, 2])})
        b.execute(agent_info=new)
        traj, _ = b.get()
        assert traj.info["agent_info/a"].tolist() == [2, 1, 0, 2]
        assert traj.trajectories["action/action"].tolist() == [[2, 2], [1, 1], [0, 0], [2, 2]]
        # Workers run with one torch thread each.
        if kind == "multi":
            assert (traj.trajectories["action/threads"] == 1).all()
        with pytest.raises(Exception, match="specs"):
            b.execute(agent_info=DictTensor({"a": torch.zeros(4)}))


def test_update_reaches_every_worker():
    """No worker keeps stale weights: after update, every row follows the new policy."""
    with make(
        "multi",
        2,
        3,
        4,
        create_agent=GreedyMLPAgent,
        agent_args={"n_actions": 3},
        env_args={"auto_reset": True},
    ) as b:
        b.reset()
        b.execute()
        before, _ = b.get()
        assert (before.info[K.POLICY_VERSION] == 0).all()
        for target in (1, 2):
            model = torch.nn.Linear(3, 3)
            with torch.no_grad():
                model.weight.zero_()
                model.bias.copy_(torch.nn.functional.one_hot(torch.tensor(target), 3).float())
            b.update(model.state_dict())
            b.execute()
            after, _ = b.get()
            assert (after.info[K.POLICY_VERSION] == target).all()
            assert (after.trajectories["action/action"] == target).all()
        assert b.version == 2


def test_update_while_running_applies_after_the_segment():
    with make(
        "multi",
        2,
        2,
        3,
        create_agent=GreedyMLPAgent,
        agent_args={"n_actions": 3},
        env_args={"auto_reset": True},
    ) as b:
        b.reset()
        b.execute()
        model = torch.nn.Linear(3, 3)
        with torch.no_grad():
            model.weight.zero_()
            model.bias.copy_(torch.tensor([0.0, 0.0, 1.0]))
        b.update(model.state_dict())
        during, _ = b.get()
        assert (during.info[K.POLICY_VERSION] == 0).all()
        b.execute()
        after, _ = b.get()
        assert (after.info[K.POLICY_VERSION] == 1).all()
        assert (after.trajectories["action/action"] == 2).all()


def test_serial_update_and_version():
    with make("serial", 1, 3, 2, create_agent=GreedyMLPAgent, agent_args={"n_actions": 3}) as b:
        b.reset()
        model = torch.nn.Linear(3, 3)
        with torch.no_grad():
            model.weight.zero_()
            model.bias.copy_(torch.tensor([0.0, 1.0, 0.0]))
        b.update(model.state_dict())
        b.execute()
        traj, _ = b.get()
    assert (traj.info[K.POLICY_VERSION] == 1).all()
    assert (traj.trajectories["action/action"] == 1).all()


def test_seeds_derive_from_global_env_index():
    """R22: neighbouring run seeds share no env seed; P does not change any env's seed."""
    a, _ = env_seed_bases(5, 1, 8)
    b, _ = env_seed_bases(6, 1, 8)
    run_a = set(range(a[0], a[0] + 8))
    run_b = set(range(b[0], b[0] + 8))
    assert not run_a & run_b
    two, _ = env_seed_bases(5, 2, 4)
    assert [two[0] + k for k in range(4)] + [two[1] + k for k in range(4)] == sorted(run_a)
    assert a[0] == 5 * SEED_BLOCK


def test_seed_lists_are_checked():
    assert env_seed_bases([0, 100], 2, 4)[0] == [0, 100]
    with pytest.raises(ConfigError, match="overlap"):
        env_seed_bases([0, 2], 2, 4)
    with pytest.raises(ConfigError, match="one per process"):
        env_seed_bases([0, 100, 200], 2, 4)


def test_same_config_is_bitwise_identical_and_seed_matters():
    """R23 with randomness on both sides: CartPole's resets and a sampling MLP agent."""

    def collect(seed):
        with SerialBatcher(
            20,
            agents.MLPAgent,
            {"obs_dim": 4, "n_actions": 2},
            batcher_helpers.cartpole_env,
            {"n_envs": 3},
            seeds=seed,
        ) as b:
            b.reset()
            b.execute()
            return b.get()[0]

    a, b, c = collect(1), collect(1), collect(2)
    assert a.trajectories.equal(b.trajectories) and a.info.equal(b.info)
    assert not torch.equal(
        a.trajectories["observation/frame"][:, 0], c.trajectories["observation/frame"][:, 0]
    )


def test_call_order_is_enforced():
    with make("multi", 1, 2, 2) as b:
        with pytest.raises(BatcherStateError, match="reset"):
            b.execute()
        with pytest.raises(BatcherStateError, match="reset"):
            b.get()
        b.reset()
        with pytest.raises(BatcherStateError, match="execute"):
            b.get()
        b.execute()
        start = time.monotonic()
        with pytest.raises(BatcherStateError, match="in flight"):
            b.execute()  # a second execute never deadlocks
        with pytest.raises(BatcherStateError, match="in flight"):
            b.reset()
        assert time.monotonic() - start < 1.0
        b.get()
        assert b.n_elems() == 2
    with pytest.raises(BatcherStateError, match="closed"):
        b.execute()


def test_serial_batcher_doctest_like_usage_and_n_elems():
    with make("serial", 1, 5, 4, env_args={"auto_reset": True}) as b:
        assert b.n_elems() == 5
        b.reset()
        b.execute()
        traj, n_running = b.get()
    assert traj.n_elems() == 5 and n_running == 5
    schema = {k.split("/")[0] + "/" for k in traj.trajectories}
    assert schema == {K.OBSERVATION, K.ACTION, K.NEXT_OBSERVATION}
    assert {"agent_info/", "env_info/", "agent_state/"} >= {
        k.split("/")[0] + "/" for k in traj.info if "/" in k
    }
    assert K.ENV_ID in traj.info and K.POLICY_VERSION in traj.info


def test_lambda_factories_work_in_workers():
    n_actions = 3

    def create_agent():
        return DeterministicAgent(n_actions=n_actions)  # a closure

    with Batcher(
        2,
        create_agent,
        {},
        lambda n_envs, seed: counter_env(n_envs, seed, n_actions=3),
        {"n_envs": 2},
        n_processes=1,
        seeds=0,
    ) as b:
        b.reset()
        b.execute()
        traj, _ = b.get()
    assert traj.n_elems() == 2


def test_env_info_reaches_the_envs():
    env_info = DictTensor({"episode_length": torch.tensor([1, 4, 2])})
    with make("serial", 1, 3, 6, env_info=DictTensor({"episode_length": torch.tensor([3])})) as b:
        b.reset(env_info=env_info)
        b.execute()
        traj, _ = b.get()
        assert traj.lengths.tolist() == [1, 4, 2]
        assert traj.info["env_info/episode_length"].tolist() == [1, 4, 2]
        b.reset()  # back to the example given to the constructor
        b.execute()
        traj, _ = b.get()
        assert traj.lengths.tolist() == [3, 3, 3]


def test_threads_per_worker_are_configurable():
    with make("multi", 1, 2, 2, create_agent=InfoAgent, agent_args={}, n_threads=2) as b:
        b.reset()
        b.execute()
        traj, _ = b.get()
    assert (traj.trajectories["action/threads"] == 2).all()


def test_get_returns_a_copy():
    with make("serial", 1, 2, 3, env_args={"auto_reset": True}) as b:
        b.reset()
        b.execute()
        first, _ = b.get()
        snapshot = first.trajectories["observation/frame"].clone()
        b.execute()
        b.get()
    assert torch.equal(first.trajectories["observation/frame"], snapshot)


def test_no_thread_left_behind():
    before = threading.active_count()
    with make("multi", 1, 2, 2) as b:
        b.reset()
    assert threading.active_count() <= before + 1  # multiprocessing's resource sharer at most


def test_n_running_property_and_agent_info_hint():
    with make("serial", 1, 3, 10) as b:
        assert b.n_running is None
        b.reset()
        assert b.n_running == 3
        b.execute()
        b.get()
        assert b.n_running == 0
    with pytest.raises(KeyError) as info:
        SerialBatcher(2, InfoAgentNeedsEpsilon, {}, counter_env, {"n_envs": 2})
    notes = "\n".join(getattr(info.value, "__notes__", []))
    if hasattr(info.value, "add_note"):
        assert "agent_info=DictTensor" in notes


class InfoAgentNeedsEpsilon(InfoAgent):
    def __call__(self, state, observation, agent_info):
        agent_info["epsilon"]  # reading it is the point
        return super().__call__(state, observation, agent_info)


def test_a_worker_report_survives_an_exception_that_cannot_describe_itself(monkeypatch):
    # The two handlers of rlstruct.batchers.core that swallow: a broken __str__ (_describe),
    # and a traceback that cannot be formatted (_format_traceback); the report still goes out.
    import traceback

    from rlstruct.batchers.core import error_payload

    class MuteError(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no words")

    try:
        raise MuteError()
    except MuteError as exc:
        report = error_payload(exc, worker=3, rollout=None)
        assert report["type"] == "MuteError" and report["worker"] == 3
        assert report["message"] == "<MuteError.__str__ raised RuntimeError>"

        def broken(*args, **kwargs):
            raise MemoryError

        monkeypatch.setattr(traceback, "format_exception", broken)
        text = error_payload(exc, worker=3, rollout=None)["traceback"]
    assert text.startswith("Traceback (most recent call last):\n")
    assert "test_a_worker_report_survives" in text
    assert text.endswith("MuteError: <MuteError.__str__ raised RuntimeError>\n")

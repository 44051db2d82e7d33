"""rlstruct.runs.episodes.EpisodeTracker on its own: auto-reset and episodic segments, keyed by
env_id.

Known answers on hand-built segments (episodes across cuts, padding garbage, several ends per
row, rows in any env order, rows that leave the batch, a reset mid-episode), then the tracker
against a plain per-env loop over real segments of both batcher modes.
"""

from __future__ import annotations

import pytest
import torch
from support.trajectory_builders import collect, steps

from rlstruct import Agent, DictTensor, Trajectories
from rlstruct.envs import GymEnv, GymEnvInf
from rlstruct.runs.episodes import EpisodeTracker


def segment(env_id: list[int], lengths: list[int], **tensors: torch.Tensor) -> Trajectories:
    return Trajectories(DictTensor({"env_id": torch.tensor(env_id)}), steps(lengths, **tensors))


def test_auto_reset_episodes_carry_across_segments():
    tracker = EpisodeTracker()
    # Env 0: an episode ends at t=1 (return 3, 2 steps), the next runs on into segment 2.
    # Env 1: no end in segment 1 (padding at t=2 holds garbage that must not count).
    returns, lengths = tracker(segment(
        [0, 1], [3, 2],
        reward=torch.tensor([[1.0, 2.0, 4.0], [1.0, 1.0, 99.0]]),
        done=torch.tensor([[False, True, False], [False, False, True]]),
        env_step=torch.tensor([[1, 2, 1], [5, 6, 7]]),
    ))
    assert returns.tolist() == [3.0] and lengths.tolist() == [2]
    assert tracker.carry.tolist() == [4.0, 2.0]
    # Env 0 ends its carried episode at t=0 (4 + 8) and a fresh one at t=2 (16 + 32).
    # Env 1 ends its long episode at t=1 (1 + 1 + 2 + 2). Reported in the order they ended.
    returns, lengths = tracker(segment(
        [0, 1], [3, 3],
        reward=torch.tensor([[8.0, 16.0, 32.0], [2.0, 2.0, 5.0]]),
        done=torch.tensor([[True, False, True], [False, True, False]]),
        env_step=torch.tensor([[2, 1, 2], [7, 8, 1]]),
    ))
    assert returns.tolist() == [12.0, 6.0, 48.0] and lengths.tolist() == [2, 8, 2]
    assert tracker.carry.tolist() == [0.0, 5.0]


def test_rows_are_matched_to_envs_by_env_id_in_any_order():
    tracker = EpisodeTracker()
    # Rows come in env order [1, 0]: env 0 ends an episode at t=1, env 1 runs on.
    returns, lengths = tracker(segment(
        [1, 0], [3, 3],
        reward=torch.tensor([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]]),
        done=torch.tensor([[False, False, False], [False, True, False]]),
        env_step=torch.tensor([[5, 6, 7], [1, 2, 1]]),
    ))
    assert returns.tolist() == [2.0] and lengths.tolist() == [2]
    assert tracker.carry.tolist() == [1.0, 6.0]
    returns, lengths = tracker(segment(
        [0, 1], [3, 3],
        reward=torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]),
        done=torch.tensor([[False, False, True], [True, False, False]]),
        env_step=torch.tensor([[2, 3, 4], [8, 1, 2]]),
    ))
    assert returns.tolist() == [8.0, 4.0] and lengths.tolist() == [8, 4]  # env 1 ended first
    assert tracker.carry.tolist() == [0.0, 4.0]


def test_episodic_rows_leave_the_batch_and_padding_never_counts():
    tracker = EpisodeTracker()
    # Episodic segments of T=3: env 0 ends at t=1 and leaves; env 1 is cut at T and goes on.
    returns, lengths = tracker(segment(
        [0, 1], [2, 3],
        reward=torch.tensor([[1.0, 2.0, 99.0], [1.0, 1.0, 1.0]]),
        done=torch.tensor([[False, True, True], [False, False, False]]),
        env_step=torch.tensor([[1, 2, 99], [1, 2, 3]]),
    ))
    assert returns.tolist() == [3.0] and lengths.tolist() == [2]
    # The next segment holds env 1 alone, in row 0.
    returns, lengths = tracker(segment(
        [1], [1], reward=torch.tensor([[5.0, 99.0]]), done=torch.tensor([[True, True]]),
        env_step=torch.tensor([[4, 99]]),
    ))
    assert returns.tolist() == [8.0] and lengths.tolist() == [4]
    assert tracker.carry.tolist() == [0.0, 0.0]


def test_an_episode_start_at_the_first_step_clears_what_was_carried():
    tracker = EpisodeTracker()
    tracker(segment([0], [2], reward=torch.ones(1, 2), done=torch.zeros(1, 2, dtype=torch.bool),
                    env_step=torch.tensor([[1, 2]])))
    assert tracker.carry.tolist() == [2.0]
    # A reset() of the batcher restarted env 0: its old episode never ends, it is dropped.
    returns, _ = tracker(segment(
        [0], [2], reward=torch.ones(1, 2), done=torch.tensor([[False, True]]),
        env_step=torch.tensor([[1, 2]]), initial_state=torch.tensor([[True, False]]),
    ))
    assert returns.tolist() == [2.0]
    tracker(segment([0], [1], reward=torch.ones(1, 1), done=torch.zeros(1, 1, dtype=torch.bool),
                    env_step=torch.tensor([[1]])))
    tracker.reset()
    assert tracker.carry.tolist() == [0.0]


def test_rows_without_a_valid_step_change_nothing():
    tracker = EpisodeTracker()
    tracker(segment([0, 1], [1, 1], reward=torch.tensor([[3.0], [4.0]]),
                    done=torch.zeros(2, 1, dtype=torch.bool), env_step=torch.ones(2, 1).long()))
    returns, lengths = tracker(segment(
        [1, 0], [0, 1], reward=torch.tensor([[99.0], [1.0]]), done=torch.tensor([[True], [True]]),
        env_step=torch.tensor([[9], [2]]),
    ))
    assert returns.tolist() == [4.0] and lengths.tolist() == [2]
    assert tracker.carry.tolist() == [0.0, 4.0]


class RandomAgent(Agent):
    """Uniform actions from its own seeded generator."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.generator = torch.Generator().manual_seed(0)

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def __call__(self, state, observation, agent_info):
        n = observation["frame"].shape[0]
        return DictTensor({"action": torch.randint(2, (n,), generator=self.generator)}), state


def episodes_by_loop(segments: list[Trajectories]) -> list[tuple[int, float, int]]:
    """``(env, return, length)`` of every finished episode, one env and one step at a time."""
    running: dict[int, tuple[float, int]] = {}
    ended = []
    for traj in segments:
        s = traj.trajectories
        for b, env in enumerate(traj.info["env_id"].tolist()):
            if traj.trajectories["observation/initial_state"][b, 0]:
                running[env] = (0.0, 0)
            total, n = running.get(env, (0.0, 0))
            for t in range(int(s.lengths[b])):
                total, n = total + float(s["_observation/reward"][b, t]), n + 1
                if s["_observation/done"][b, t]:
                    ended.append((env, total, n))
                    total, n = 0.0, 0
            running[env] = (total, n)
    return sorted(ended)


@pytest.mark.parametrize(("create_env", "n_timesteps"), [(GymEnvInf, 16), (GymEnv, 7)])
def test_real_segments_match_a_per_env_loop(create_env, n_timesteps):
    segments = collect(RandomAgent, torch.nn.Linear(1, 1), n_segments=12,
                       n_timesteps=n_timesteps, n_envs=3, create_env=create_env)
    assert len(segments) > 1
    tracker = EpisodeTracker()
    found = []
    for traj in segments:
        returns, lengths = tracker(traj)
        assert returns.dtype == torch.float64 and lengths.dtype == torch.int64
        found += [(float(r), int(n)) for r, n in zip(returns, lengths)]
    expected = episodes_by_loop(segments)
    assert expected, "no episode ended: the test would prove nothing"
    assert sorted(found) == sorted((r, n) for _, r, n in expected)

"""FrameReplayBuffer against the plain ReplayBuffer: the same transitions, bit for bit, on random
frame-stacked episodes with resets, while each frame is stored once."""

from __future__ import annotations

import io

import pytest
import torch

from rlstruct import DictTensor, TemporalDictTensor, Trajectories
from rlstruct import keys as K
from rlstruct.blocks.frame_buffer import FrameReplayBuffer
from rlstruct.blocks.replay_buffer import ReplayBuffer
from rlstruct.errors import ConfigError, KeyMismatchError, ShapeError

KEYS = (K.OBS_FRAME, K.STORED_ACTION, K.NEXT_FRAME, K.NEXT_REWARD, K.NEXT_TERMINATED,
        K.NEXT_TRUNCATED)


class Streams:
    """``n_envs`` frame-stacked envs with random episode lengths: a reset stack is the reset
    frame repeated (``pad="repeat"``) or zeros then the reset frame (``pad="zeros"``); the next
    observation at an episode's end is the true final stack; ``shuffled`` stacks are random
    (no frame is shared: the buffer must still give them back)."""

    def __init__(self, n_envs: int, k: int = 4, shape=(3, 5), pad: str = "repeat",
                 seed: int = 0, shuffled: bool = False) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.k, self.shape, self.pad, self.shuffled = k, shape, pad, shuffled
        self.n_episodes = 0
        self.stacks = [self._reset() for _ in range(n_envs)]
        self.left = [self._length() for _ in range(n_envs)]

    def _frame(self) -> torch.Tensor:
        return torch.randint(1, 256, self.shape, generator=self.g, dtype=torch.uint8)

    def _length(self) -> int:
        return int(torch.randint(1, 12, (), generator=self.g))

    def _reset(self) -> torch.Tensor:
        self.n_episodes += 1
        frame = self._frame()
        if self.pad == "zeros":
            return torch.stack([torch.zeros_like(frame)] * (self.k - 1) + [frame])
        return torch.stack([frame] * self.k)

    def _next(self, stack: torch.Tensor) -> torch.Tensor:
        if self.shuffled:
            return torch.stack([self._frame() for _ in range(self.k)])
        return torch.cat([stack[1:], self._frame()[None]])

    def segment(self, t_max: int, lengths: list[int]) -> TemporalDictTensor:
        b = len(self.stacks)
        obs = torch.zeros(b, t_max, self.k, *self.shape, dtype=torch.uint8)
        nxt, term = torch.zeros_like(obs), torch.zeros(b, t_max, dtype=torch.bool)
        for row in range(b):
            for t in range(lengths[row]):
                obs[row, t] = self.stacks[row]
                nxt[row, t] = self._next(self.stacks[row])
                self.left[row] -= 1
                if self.left[row] == 0:  # the episode ends: the next one starts from a reset
                    term[row, t] = True
                    self.stacks[row], self.left[row] = self._reset(), self._length()
                else:
                    self.stacks[row] = nxt[row, t]
        steps = {
            K.OBS_FRAME: obs, K.NEXT_FRAME: nxt, K.NEXT_TERMINATED: term,
            K.STORED_ACTION: torch.randint(6, (b, t_max), generator=self.g),
            K.NEXT_REWARD: torch.randn(b, t_max, generator=self.g),
            K.NEXT_TRUNCATED: torch.zeros(b, t_max, dtype=torch.bool),
        }
        return TemporalDictTensor(steps, torch.tensor(lengths))


def random_lengths(g: torch.Generator, b: int, t_max: int) -> list[int]:
    return torch.randint(0, t_max + 1, (b,), generator=g).tolist()


def assert_same(a: DictTensor, b: DictTensor) -> None:
    assert a.n_elems() == b.n_elems()
    for key in KEYS:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("pad", ["repeat", "zeros"])
@pytest.mark.parametrize("k", [4, 1])
def test_the_same_transitions_as_the_plain_buffer_each_frame_stored_once(pad: str, k: int):
    streams, g = Streams(5, k=k, pad=pad), torch.Generator().manual_seed(1)
    plain = ReplayBuffer(150, keys=KEYS)
    frames = FrameReplayBuffer(150, keys=KEYS)
    for _ in range(40):  # about 4 times the capacity: the buffers wrap around
        segment = streams.segment(6, random_lengths(g, 5, 6))
        assert frames.add(segment) == plain.add(segment)
        assert len(frames) == len(plain)
        assert_same(frames.transitions(), plain.transitions())
    # One frame a step, plus each reset stack's distinct frames (one, or the zeros and one).
    per_reset = 1 if pad == "repeat" or k == 1 else 2
    assert frames.n_frames <= frames.n_added + per_reset * streams.n_episodes + 5 * k


def test_stacks_that_share_nothing_come_back_whole():
    streams, g = Streams(3, shuffled=True, seed=2), torch.Generator().manual_seed(2)
    plain, frames = ReplayBuffer(60, keys=KEYS), FrameReplayBuffer(60, keys=KEYS)
    for _ in range(12):
        segment = streams.segment(5, random_lengths(g, 3, 5))
        plain.add(segment), frames.add(segment)
    assert_same(frames.transitions(), plain.transitions())
    assert frames.n_frames > 2 * frames.n_added  # nothing was shared, and nothing was lost


def test_too_few_frame_slots_keep_fewer_transitions_all_exact():
    streams, g = Streams(4, seed=3), torch.Generator().manual_seed(3)
    plain = ReplayBuffer(200, keys=KEYS)
    frames = FrameReplayBuffer(200, keys=KEYS, frame_capacity=90)
    for _ in range(30):
        segment = streams.segment(6, random_lengths(g, 4, 6))
        plain.add(segment), frames.add(segment)
        n = len(frames)
        assert 0 < n < len(plain) or len(plain) <= 60
        assert_same(frames.transitions(), plain.transitions().slice(len(plain) - n, len(plain)))


def test_rows_in_another_order_continue_their_env_by_env_id():
    streams, g = Streams(4, seed=4), torch.Generator().manual_seed(4)
    plain, frames = ReplayBuffer(500, keys=KEYS), FrameReplayBuffer(500, keys=KEYS)
    for _ in range(10):
        segment = streams.segment(5, [5, 5, 5, 5])
        order = torch.randperm(4, generator=g)
        rows = Trajectories(DictTensor({K.ENV_ID: order}), segment.index(order))  # permuted rows
        plain.add(rows), frames.add(rows)
    assert_same(frames.transitions(), plain.transitions())
    # Shared across segments too: one frame a step and one a reset, plus the first stacks.
    assert frames.n_frames <= frames.n_added + streams.n_episodes + 4


def test_samples_are_stored_transitions_and_resume_from_a_state_dict():
    streams, g = Streams(3, seed=5), torch.Generator().manual_seed(5)
    a = FrameReplayBuffer(80, keys=KEYS, generator=torch.Generator().manual_seed(7))
    for _ in range(20):
        a.add(streams.segment(4, random_lengths(g, 3, 4)))
    state = io.BytesIO()
    torch.save(a.state_dict(), state)
    state.seek(0)
    b = FrameReplayBuffer(80, keys=KEYS)
    b.load_state_dict(torch.load(state, weights_only=True))
    for _ in range(5):  # both go on the same way: the same content and the same draws
        segment = streams.segment(4, random_lengths(g, 3, 4))
        a.add(segment), b.add(segment)
        assert_same(a.transitions(), b.transitions())
        assert_same(a.sample(16), b.sample(16))
    g_copy = torch.Generator().manual_seed(9)
    a.load_state_dict({**a.state_dict(), "generator_state": g_copy.get_state()})
    expected = a.transitions().index(torch.randint(len(a), (32,), generator=g_copy))
    assert_same(a.sample(32), expected)


def test_bad_configs_and_batches_are_refused():
    with pytest.raises(ConfigError, match="must include 'observation/frame'"):
        FrameReplayBuffer(10, keys=[K.OBS_FRAME, K.STORED_ACTION])
    with pytest.raises(ConfigError, match="frame_capacity must be an int > 0"):
        FrameReplayBuffer(10, frame_capacity=0)
    buffer = FrameReplayBuffer(10, keys=KEYS)
    with pytest.raises(ShapeError, match="empty buffer"):
        buffer.sample(1)
    segment = Streams(2).segment(3, [3, 3])
    with pytest.raises(KeyMismatchError, match="lacks keys"):
        buffer.add(segment.get([K.OBS_FRAME, K.STORED_ACTION]))
    buffer.add(segment)
    floats = segment.apply(lambda v: v.float() if v.dtype == torch.uint8 else v)
    with pytest.raises(ShapeError, match="nothing is cast"):
        buffer.add(floats)
    with pytest.raises(ConfigError, match="capacity 10, this buffer 11"):
        FrameReplayBuffer(11, keys=KEYS).load_state_dict(buffer.state_dict())

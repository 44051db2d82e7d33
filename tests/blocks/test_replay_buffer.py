"""Tests of ReplayBuffer: valid steps only, circular order, sampling, dtypes, devices, errors,
checkpoints and a DQN TD target computed from a sample.

Every valid step gets a unique transition id ``u`` (counted row by row in time order, across
batches: the order of ``to_transitions``), and every key encodes it, so a test can tell which
transitions the buffer holds, in which order, and that the keys of a row stayed aligned. Padding
steps hold sentinels (-1e9, 255 for frames) that must never come out of the buffer. The `device`
fixture (cpu, plus cuda when available) comes from tests/conftest.py.
"""

from __future__ import annotations

import io

import pytest
import torch

from rlstruct import DictTensor, TemporalDictTensor, Trajectories
from rlstruct.blocks.functional import td_targets
from rlstruct.blocks.replay_buffer import ReplayBuffer
from rlstruct.errors import (
    ConfigError,
    DeviceContractError,
    KeyMismatchError,
    RLStructError,
    ShapeError,
)

SENTINEL = -1e9
FRAME_PAD = 255
N_ACTIONS = 3
DQN_KEYS = [
    "observation/frame",
    "action/action",
    "_observation/frame",
    "_observation/reward",
    "_observation/terminated",
    "_observation/truncated",
]


def make_batch(lengths: list[int], n_steps: int, first_uid: int = 0) -> Trajectories:
    """Trajectories whose valid steps carry the ids first_uid, first_uid + 1, ...; padding holds
    sentinels."""
    b = len(lengths)
    valid = torch.arange(n_steps).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    n = int(valid.sum())
    u = torch.full((b, n_steps), -1, dtype=torch.long)
    u[valid] = torch.arange(first_uid, first_uid + n)  # row-major: row by row, in time order

    def pad(x: torch.Tensor, value: float) -> torch.Tensor:
        m = valid.view(b, n_steps, *([1] * (x.dim() - 2)))
        return torch.where(m, x, torch.full_like(x, value))

    frame = (u % 200).to(torch.uint8).view(b, n_steps, 1, 1).expand(b, n_steps, 2, 2)
    next_frame = ((u + 1) % 200).to(torch.uint8).view(b, n_steps, 1, 1).expand(b, n_steps, 2, 2)
    steps = {
        "observation/uid": pad(u.double(), SENTINEL),
        "observation/frame": pad(frame.contiguous(), FRAME_PAD),
        "observation/env_step": pad(u, SENTINEL),
        "action/action": pad(u % N_ACTIONS, SENTINEL),
        "action/q": pad(torch.stack([u.float(), -u.float()], dim=2), SENTINEL),
        "_observation/frame": pad(next_frame.contiguous(), FRAME_PAD),
        "_observation/reward": pad(u.float() / 4, SENTINEL),
        "_observation/terminated": (u % 5 == 4) & valid,
        "_observation/truncated": (u % 7 == 6) & valid,
    }
    info = DictTensor(
        {"env_id": torch.arange(b), "agent_info/epsilon": torch.full((b,), 0.1)}, batch_size=b
    )
    return Trajectories(info, TemporalDictTensor(steps, torch.tensor(lengths)))


def uids(dt: DictTensor) -> list[int]:
    """The transition ids of ``dt``'s rows, checking that no padding came out and that every key
    of a row belongs to the same transition."""
    u = dt["observation/uid"]
    assert not (u == SENTINEL).any(), "a padding step was stored"
    assert (u >= 0).all()
    ul = u.long()
    for key, expected in {
        "observation/frame": (ul % 200).to(torch.uint8).view(-1, 1, 1).expand(-1, 2, 2),
        "observation/env_step": ul,
        "action/action": ul % N_ACTIONS,
        "action/q": torch.stack([u.float(), -u.float()], dim=1),
        "_observation/frame": ((ul + 1) % 200).to(torch.uint8).view(-1, 1, 1).expand(-1, 2, 2),
        "_observation/reward": u.float() / 4,
        "_observation/terminated": ul % 5 == 4,
        "_observation/truncated": ul % 7 == 6,
    }.items():
        if key in dt:
            assert torch.equal(dt[key], expected), f"key {key} is not aligned with the row ids"
    return ul.tolist()


# ---------------------------------------------------------------------------- content and order
def test_only_valid_steps_are_stored(device: torch.device) -> None:
    rb = ReplayBuffer(50, device=device)
    batch = make_batch([3, 0, 5, 1], n_steps=5).to(device)
    assert rb.add(batch) == 9
    assert len(rb) == 9 and rb.n_added == 9
    assert uids(rb.transitions()) == list(range(9))
    drawn = uids(rb.sample(2000))
    assert set(drawn) == set(range(9))  # every stored transition, nothing else
    assert not (rb.sample(500)["observation/frame"] == FRAME_PAD).any()


def test_circular_overwrite_keeps_the_last_capacity_transitions_in_order(
    device: torch.device,
) -> None:
    rb = ReplayBuffer(7, device=device)
    expected: list[int] = []
    start = 0
    for lengths in ([2, 0, 2], [1, 3, 1], [3]):  # 4, 5 and 3 transitions
        batch = make_batch(lengths, n_steps=3, first_uid=start).to(device)
        n = rb.add(batch)
        assert n == sum(lengths)
        start += n
        expected = (expected + list(range(start - n, start)))[-7:]
        assert uids(rb.transitions()) == expected
        assert len(rb) == len(expected)
    assert rb.n_added == 12
    assert uids(rb.transitions()) == list(range(5, 12))


def test_wrap_around_splits_the_copy() -> None:
    rb = ReplayBuffer(5)
    rb.add(make_batch([3], n_steps=3))
    assert rb.position == 3
    rb.add(make_batch([2, 2], n_steps=2, first_uid=3))  # rows 3, 4, then 0, 1
    assert rb.position == 2 and len(rb) == 5
    storage_order = rb.state_dict()["tensors"]["observation/uid"].long().tolist()
    assert storage_order == [5, 6, 2, 3, 4]
    assert uids(rb.transitions()) == [2, 3, 4, 5, 6]


def test_batch_larger_than_capacity_keeps_its_last_rows() -> None:
    rb = ReplayBuffer(4)
    rb.add(make_batch([2], n_steps=2))
    assert rb.add(make_batch([5, 2, 4], n_steps=5, first_uid=2)) == 11
    assert rb.n_added == 13 and len(rb) == 4
    assert uids(rb.transitions()) == [9, 10, 11, 12]
    fresh = ReplayBuffer(4)
    fresh.add(make_batch([5, 2, 4], n_steps=5))
    assert uids(fresh.transitions()) == [7, 8, 9, 10]
    assert fresh.position == 0


def test_empty_batch_adds_nothing_but_fixes_the_specs() -> None:
    rb = ReplayBuffer(4)
    assert rb.add(make_batch([0, 0], n_steps=3)) == 0
    assert len(rb) == 0 and rb.n_added == 0
    assert rb.specs()["observation/frame"] == (torch.Size([2, 2]), torch.uint8)
    with pytest.raises(ShapeError, match="empty buffer"):
        rb.sample(1)


def test_accepts_a_temporal_dict_tensor_and_ignores_info() -> None:
    batch = make_batch([2, 1], n_steps=2)
    rb = ReplayBuffer(10)
    rb.add(batch.trajectories)
    rb.add(make_batch([2], n_steps=2, first_uid=3))
    assert set(rb.keys()) == set(batch.trajectories.keys())
    assert not any(k.startswith(("agent_info/", "env_id")) for k in rb.sample(3))
    assert uids(rb.transitions()) == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------------------- sampling
def test_sampling_is_reproducible_with_a_seeded_generator(device: torch.device) -> None:
    def draws(seed: int) -> list[list[int]]:
        rb = ReplayBuffer(64, device=device, generator=torch.Generator(device).manual_seed(seed))
        rb.add(make_batch([20, 13, 20], n_steps=20).to(device))
        return [uids(rb.sample(32)) for _ in range(3)]

    assert draws(0) == draws(0)
    assert draws(0) != draws(1)


def test_sampling_without_generator_follows_the_global_seed() -> None:
    def draws(seed: int) -> list[int]:
        torch.manual_seed(seed)
        rb = ReplayBuffer(64)
        rb.add(make_batch([30, 20], n_steps=30))
        return uids(rb.sample(40))

    assert draws(123) == draws(123)
    assert draws(123) != draws(124)


def test_samples_come_from_the_filled_part_only(device: torch.device) -> None:
    rb = ReplayBuffer(100, device=device)
    rb.add(make_batch([4, 2], n_steps=4).to(device))
    assert set(uids(rb.sample(3000))) == set(range(6))
    # The storage keeps old rows after clear(): they must never be drawn again.
    rb.clear()
    rb.add(make_batch([3], n_steps=4, first_uid=100).to(device))
    assert set(uids(rb.sample(3000))) == {100, 101, 102}


def test_sample_zero_rows() -> None:
    rb = ReplayBuffer(8)
    rb.add(make_batch([2], n_steps=2))
    out = rb.sample(0)
    assert out.n_elems() == 0 and out["observation/frame"].shape == (0, 2, 2)


def test_dtypes_and_shapes_are_preserved(device: torch.device) -> None:
    rb = ReplayBuffer(16, device=device)
    batch = make_batch([3, 2], n_steps=3).to(device)
    rb.add(batch)
    out = rb.sample(5)
    assert out.device().type == device.type
    for key, (feat, dtype) in batch.trajectories.specs().items():
        assert out[key].dtype == dtype, key
        assert out[key].shape == (5, *feat), key
        assert rb.specs()[key] == (feat, dtype)
    assert out["observation/frame"].dtype == torch.uint8
    assert out["_observation/terminated"].dtype == torch.bool
    assert out["action/action"].dtype == torch.int64


def test_samples_are_new_tensors_without_autograd_history() -> None:
    batch = make_batch([3], n_steps=3)
    q = batch.trajectories["action/q"].clone().requires_grad_(True)
    batch.trajectories["action/q"] = q * 1.0
    rb = ReplayBuffer(8)
    rb.add(batch)
    out = rb.sample(4)
    assert not out["action/q"].requires_grad
    out["observation/uid"].fill_(-5.0)  # writing into a sample leaves the buffer intact
    assert uids(rb.transitions()) == [0, 1, 2]


# ---------------------------------------------------------------------------- devices
def test_storage_is_allocated_on_the_requested_device_meta() -> None:
    rb = ReplayBuffer(10, device="meta")
    assert rb.device == torch.device("meta")
    assert rb.add(make_batch([3, 1], n_steps=3)) == 4  # a CPU batch, copied to meta
    assert len(rb) == 4
    for key, v in rb.state_dict()["tensors"].items():
        assert v.device.type == "meta", key
    out = rb.sample(6)
    assert out.device() == torch.device("meta")
    for key, v in out.items():
        assert v.device.type == "meta", key
        assert v.shape[0] == 6
    assert out["observation/frame"].dtype == torch.uint8


@pytest.mark.gpu
def test_cuda_buffer_takes_cpu_batches_and_samples_on_cuda() -> None:
    rb = ReplayBuffer(32, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    assert rb.device.type == "cuda" and rb.device.index is not None
    rb.add(make_batch([4, 2], n_steps=4))  # CPU batch
    rb.add(make_batch([3], n_steps=3, first_uid=6).to("cuda"))  # CUDA batch
    for v in rb.state_dict()["tensors"].values():
        assert v.is_cuda
    out = rb.sample(100)
    assert all(v.is_cuda for v in out.values())
    assert set(uids(out.to("cpu"))) <= set(range(9))
    # A CPU buffer takes a CUDA batch too (only its valid rows cross the bus).
    cpu = ReplayBuffer(8)
    cpu.add(make_batch([2, 1], n_steps=2).to("cuda"))
    assert uids(cpu.transitions()) == [0, 1, 2]
    with pytest.raises(DeviceContractError, match="generator is on cpu"):
        ReplayBuffer(8, device="cuda", generator=torch.Generator())


# ---------------------------------------------------------------------------- keys
def test_keys_restriction() -> None:
    rb = ReplayBuffer(10, keys=DQN_KEYS)
    assert rb.keys() == tuple(DQN_KEYS)
    rb.add(make_batch([3, 2], n_steps=3))
    assert rb.keys() == tuple(DQN_KEYS)
    assert set(rb.sample(4).keys()) == set(DQN_KEYS)
    assert set(rb.state_dict()["tensors"]) == set(DQN_KEYS)
    # Extra keys in a later batch are ignored; a missing one is an error.
    batch = make_batch([2], n_steps=2).trajectories
    batch["observation/extra"] = torch.zeros(1, 2)
    assert rb.add(batch) == 2
    with pytest.raises(KeyMismatchError, match=r"lacks keys \['_observation/truncated'\]"):
        rb.add(make_batch([2], n_steps=2).trajectories.get(DQN_KEYS[:-1]))
    assert len(rb) == 7


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize("capacity", [0, -3, 2.5, True, "10"])
def test_bad_capacity(capacity: object) -> None:
    with pytest.raises(ConfigError, match="capacity must be an int > 0"):
        ReplayBuffer(capacity)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("keys", "match"),
    [
        ("observation/frame", "got the str"),
        ([], "keys is empty"),
        (["action/action", "action/action"], "more than once"),
        (["agent_info/epsilon"], "only trajectory keys"),
        (["lengths"], "only trajectory keys"),
    ],
)
def test_bad_keys(keys: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ReplayBuffer(4, keys=keys)  # type: ignore[arg-type]


def test_bad_device() -> None:
    with pytest.raises(ConfigError, match="cannot allocate on device 'bogus'"):
        ReplayBuffer(4, device="bogus")


def test_sample_errors() -> None:
    rb = ReplayBuffer(4)
    with pytest.raises(ShapeError, match="empty buffer"):
        rb.sample(2)
    rb.add(make_batch([2], n_steps=2))
    with pytest.raises(ShapeError, match="n must be an int >= 0, got -1"):
        rb.sample(-1)
    rb.clear()
    with pytest.raises(ShapeError, match="empty buffer") as info:
        rb.sample(1)
    assert isinstance(info.value, RLStructError) and isinstance(info.value, ValueError)


def test_add_rejects_other_types() -> None:
    with pytest.raises(TypeError, match="got DictTensor"):
        ReplayBuffer(4).add(DictTensor({"x": torch.zeros(2)}))  # type: ignore[arg-type]


def test_later_batches_must_match_the_storage() -> None:
    rb = ReplayBuffer(8)
    rb.add(make_batch([3], n_steps=3))
    before = rb.state_dict()["tensors"]["observation/uid"].clone()

    missing = make_batch([2], n_steps=2).trajectories
    missing.unset("action/q")
    with pytest.raises(KeyMismatchError, match=r"lacks keys \['action/q'\]"):
        rb.add(missing)
    extra = make_batch([2], n_steps=2).trajectories
    extra["observation/new"] = torch.zeros(1, 2)
    with pytest.raises(KeyMismatchError, match=r"unexpected keys \['observation/new'\]"):
        rb.add(extra)

    shape = make_batch([2], n_steps=2).trajectories
    shape["action/q"] = torch.zeros(1, 2, 3)
    with pytest.raises(ShapeError, match=r"'action/q' has feature shape \(3,\), expected \(2,\)"):
        rb.add(shape)

    dtype = make_batch([2], n_steps=2).trajectories
    dtype["observation/frame"] = dtype["observation/frame"].float()
    with pytest.raises(
        ShapeError,
        match=r"'observation/frame' has dtype torch.float32, expected torch.uint8",
    ):
        rb.add(dtype)
    flags = make_batch([2], n_steps=2).trajectories
    flags["_observation/terminated"] = flags["_observation/terminated"].long()
    with pytest.raises(ShapeError, match=r"has dtype torch\.int64, expected torch\.bool"):
        rb.add(flags)

    # Every rejected add left the buffer as it was.
    assert len(rb) == 3 and rb.n_added == 3 and rb.position == 3
    assert torch.equal(rb.state_dict()["tensors"]["observation/uid"], before)


def test_clear_keeps_storage_and_specs() -> None:
    rb = ReplayBuffer(4)
    rb.add(make_batch([3], n_steps=3))
    storage = rb.state_dict()["tensors"]["observation/frame"]
    rb.clear()
    assert len(rb) == 0 and rb.n_added == 0 and rb.position == 0
    assert rb.keys() and rb.specs()["observation/frame"][1] == torch.uint8
    bad = make_batch([1], n_steps=1).trajectories
    bad["observation/frame"] = bad["observation/frame"].float()
    with pytest.raises(ShapeError, match="dtype"):
        rb.add(bad)
    rb.add(make_batch([2], n_steps=2, first_uid=50))
    assert uids(rb.transitions()) == [50, 51]
    # Same memory: nothing was reallocated.
    assert rb.state_dict()["tensors"]["observation/frame"].data_ptr() == storage.data_ptr()


# ---------------------------------------------------------------------------- checkpoints
def test_state_dict_round_trip() -> None:
    rb = ReplayBuffer(6, generator=torch.Generator().manual_seed(7))
    rb.add(make_batch([4], n_steps=4))
    rb.add(make_batch([3], n_steps=3, first_uid=4))  # wraps: position 1
    rb.sample(5)  # advance the generator
    buf = io.BytesIO()
    torch.save(rb.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)

    restored = ReplayBuffer(6)
    restored.load_state_dict(state)
    assert (len(restored), restored.n_added, restored.position) == (6, 7, 1)
    assert uids(restored.transitions()) == uids(rb.transitions()) == [1, 2, 3, 4, 5, 6]
    # The generator state travels: both draw the same next batches.
    assert uids(restored.sample(20)) == uids(rb.sample(20))
    # And both evolve the same way.
    for b in (rb, restored):
        b.add(make_batch([2], n_steps=2, first_uid=7))
    assert uids(restored.transitions()) == uids(rb.transitions()) == [3, 4, 5, 6, 7, 8]

    # A buffer built with its own generator keeps that object, set to the saved state.
    own = torch.Generator().manual_seed(99)
    mine = ReplayBuffer(6, generator=own)
    mine.load_state_dict(state)
    assert torch.equal(own.get_state(), state["generator_state"])
    twin = ReplayBuffer(6)
    twin.load_state_dict(state)
    assert uids(mine.sample(20)) == uids(twin.sample(20))

    # Loading replaces whatever a buffer held.
    other = ReplayBuffer(6)
    other.add(make_batch([1], n_steps=1, first_uid=90))
    other.load_state_dict(state)
    assert uids(other.transitions()) == [1, 2, 3, 4, 5, 6]

    # An empty buffer's state empties a buffer.
    other.load_state_dict(ReplayBuffer(6).state_dict())
    assert len(other) == 0 and other.n_added == 0


def test_load_state_dict_errors() -> None:
    rb = ReplayBuffer(6)
    rb.add(make_batch([3], n_steps=3))
    state = rb.state_dict()
    with pytest.raises(ConfigError, match="capacity 6, this buffer 5"):
        ReplayBuffer(5).load_state_dict(state)
    with pytest.raises(KeyMismatchError, match="this buffer stores"):
        ReplayBuffer(6, keys=DQN_KEYS).load_state_dict(state)
    other = ReplayBuffer(6)
    bad = make_batch([1], n_steps=1).trajectories
    bad["observation/frame"] = bad["observation/frame"].long()
    other.add(bad)
    with pytest.raises(ShapeError, match=r"'observation/frame' has dtype torch\.uint8"):
        other.load_state_dict(state)
    assert len(other) == 1  # untouched
    with pytest.raises(ConfigError, match="inconsistent state"):
        ReplayBuffer(6).load_state_dict({**state, "position": 5})


# ---------------------------------------------------------------------------- DQN
def test_dqn_td_target_from_sampled_transitions() -> None:
    """add -> sample -> r + gamma * (1 - terminated) * max_a Q(s', a) with a toy linear Q."""
    gamma = 0.9
    weights = torch.tensor(
        [[0.5, -1.0, 0.25], [0.0, 2.0, 0.5], [1.0, 0.0, -0.5], [-0.25, 0.5, 1.0]],
        requires_grad=True,
    )

    def q_values(frame: torch.Tensor) -> torch.Tensor:  # (n, 2, 2) uint8 -> (n, N_ACTIONS)
        return frame.flatten(1).float() / 255 @ weights

    rb = ReplayBuffer(40, keys=DQN_KEYS, generator=torch.Generator().manual_seed(0))
    rb.add(make_batch([10, 4, 10], n_steps=10))
    rb.add(make_batch([10, 10], n_steps=10, first_uid=24))  # 44 > 40: wraps
    batch = rb.sample(256)

    with torch.no_grad():
        next_q = q_values(batch["_observation/frame"]).max(dim=1).values
    target = td_targets(
        batch["_observation/reward"].unsqueeze(1),
        next_q.unsqueeze(1),
        batch["_observation/terminated"].unsqueeze(1),
        batch["_observation/truncated"].unsqueeze(1),
        gamma,
    ).squeeze(1)

    # The expected target of each sampled transition, rebuilt from its id alone.
    col = weights.detach().sum(dim=0)
    u = batch["_observation/reward"] * 4  # reward = u / 4
    assert set(u.long().tolist()) <= set(range(4, 44))  # the first 4 were overwritten
    nxt = ((u.long() + 1) % 200).float() / 255
    expected = u / 4 + gamma * (u.long() % 5 != 4) * (nxt.unsqueeze(1) * col).max(dim=1).values
    torch.testing.assert_close(target, expected)
    term = batch["_observation/terminated"]
    trunc = batch["_observation/truncated"] & ~term
    assert term.any() and trunc.any()  # both cases were exercised
    torch.testing.assert_close(target[term], batch["_observation/reward"][term])
    assert (target[trunc] != batch["_observation/reward"][trunc]).any()  # truncated bootstraps

    # The sample feeds a DQN loss directly.
    q = q_values(batch["observation/frame"]).gather(1, batch["action/action"].unsqueeze(1))
    loss = torch.nn.functional.mse_loss(q.squeeze(1), target)
    loss.backward()
    assert weights.grad is not None and weights.grad.abs().sum() > 0

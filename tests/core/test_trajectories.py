"""Tests of Trajectories: construction checks, rows, devices, cat and sampling.

Every row carries its own id (``env_id`` in info, ``observation/row`` at every step), so that a
test can tell which rows a method picked and that info and steps stayed aligned. The `device`
fixture (cpu, plus cuda when available) comes from tests/conftest.py.
"""

from __future__ import annotations

import pytest
import torch

from rlstruct import DictTensor, TemporalDictTensor, Trajectories
from rlstruct.errors import DeviceContractError, KeyMismatchError, ShapeError


def make_traj(
    lengths: list[int], n_steps: int, device, with_info: bool = True, first_id: int = 0
) -> Trajectories:
    b = len(lengths)
    ids = torch.arange(first_id, first_id + b)
    info = (
        DictTensor(
            {
                "env_id": ids,
                "agent_info/epsilon": ids.double() / 10,
                "agent_state/h": ids.float().unsqueeze(1).repeat(1, 3),
            },
            batch_size=b,
        )
        if with_info
        else DictTensor()
    )
    steps = {
        "observation/row": ids.view(b, 1).repeat(1, n_steps),
        "observation/frame": torch.randint(0, 256, (b, n_steps, 2, 2), dtype=torch.uint8),
        "action/action": torch.arange(n_steps).repeat(b, 1) + 2**53 + 1,
        "_observation/done": torch.zeros(b, n_steps, dtype=torch.bool),
    }
    traj = TemporalDictTensor(steps, torch.tensor(lengths, dtype=torch.long))
    return Trajectories(info.to(device), traj.to(device))


def row_ids(tr: Trajectories) -> list[int]:
    """The ids of the rows, checking that info and trajectories agree on them."""
    ids = tr.trajectories["observation/row"][:, 0].tolist() if tr.trajectories.n_timesteps() else []
    if not tr.info.empty():
        assert tr.info["env_id"].tolist() == ids
    return ids


LENGTHS = [3, 0, 4, 1, 4]


@pytest.fixture(params=["with_info", "empty_info"])
def traj(request: pytest.FixtureRequest, device: torch.device) -> Trajectories:
    return make_traj(LENGTHS, 4, device, with_info=request.param == "with_info")


def test_construction_and_description(traj: Trajectories, device: torch.device) -> None:
    assert traj.n_elems() == len(LENGTHS)
    assert traj.device().type == device.type
    assert traj.lengths.tolist() == LENGTHS
    assert traj.lengths is traj.trajectories.lengths
    assert row_ids(traj) == list(range(len(LENGTHS)))
    if not traj.info.empty():
        assert traj.info.device().type == device.type


def test_empty_trajectories() -> None:
    tr = Trajectories(DictTensor(), TemporalDictTensor(n_timesteps=3))
    assert tr.n_elems() == 0 and tr.lengths.tolist() == []
    assert tr.sample(0).n_elems() == 0


def test_repr(traj: Trajectories) -> None:
    text = repr(traj)
    assert text.startswith("Trajectories(") and "observation/row" in text
    assert ("env_id" in text) == (not traj.info.empty())


def test_to(traj: Trajectories, device: torch.device) -> None:
    assert traj.to(device) is traj
    assert traj.to(device.type, non_blocking=True) is traj
    moved = traj.to("meta")
    assert moved is not traj
    assert moved.device() == torch.device("meta") and moved.lengths.is_meta
    if not traj.info.empty():
        assert moved.info.device() == torch.device("meta")
    assert moved.n_elems() == traj.n_elems()


@pytest.mark.gpu
def test_to_cuda_roundtrip() -> None:
    tr = make_traj(LENGTHS, 4, "cpu")
    back = tr.to("cuda").to("cpu")
    assert back.info.equal(tr.info) and back.trajectories.equal(tr.trajectories)


def test_index(traj: Trajectories, device: torch.device) -> None:
    n = traj.n_elems()
    mask = [b % 2 == 1 for b in range(n)]
    for idx, rows in [
        (2, [2]),
        (-1, [n - 1]),
        ([4, 0, 4], [4, 0, 4]),
        (torch.tensor([1, 3]), [1, 3]),
        (torch.tensor([1, 3], device=device), [1, 3]),
        (torch.tensor(mask, device=device), [b for b in range(n) if mask[b]]),
        ([], []),
    ]:
        out = traj.index(idx)
        assert out.n_elems() == len(rows)
        assert out.lengths.tolist() == [LENGTHS[r] for r in rows]
        assert row_ids(out) == rows
        if not traj.info.empty():
            assert out.info["agent_state/h"].tolist() == [[float(r)] * 3 for r in rows]
        else:
            assert out.info.empty()


def test_cat_different_t(device: torch.device) -> None:
    a = make_traj([2, 1], 2, device, first_id=0)
    b = make_traj([5, 0, 3], 5, device, first_id=2)
    out = Trajectories.cat([a, b])
    assert out.n_elems() == 5 and out.trajectories.n_timesteps() == 5
    assert out.lengths.tolist() == [2, 1, 5, 0, 3]
    assert out.info["env_id"].tolist() == [0, 1, 2, 3, 4]
    rows = out.trajectories["observation/row"]
    assert torch.equal(rows[:2, :2], a.trajectories["observation/row"])
    assert not out.trajectories["observation/row"][:2, 2:].any()  # zero padding
    assert out.trajectories["action/action"].dtype == torch.int64
    assert torch.equal(out.trajectories["action/action"][2:], b.trajectories["action/action"])
    no_info = Trajectories.cat([make_traj([1], 1, device, with_info=False)] * 2)
    assert no_info.info.empty() and no_info.n_elems() == 2


def test_sample_reproducible_with_seeded_generator(traj: Trajectories) -> None:
    def draw(seed: int, replace: bool = False) -> list[int]:
        g = torch.Generator().manual_seed(seed)
        return row_ids(traj.sample(3, generator=g, replace=replace))

    assert draw(0) == draw(0)
    assert draw(5, replace=True) == draw(5, replace=True)
    # Not a constant: over a few seeds the draws differ.
    assert len({tuple(draw(s)) for s in range(8)}) > 1


def test_sample_without_replacement_gives_distinct_rows(traj: Trajectories) -> None:
    n = traj.n_elems()
    for k in range(n + 1):
        out = traj.sample(k, generator=torch.Generator().manual_seed(k))
        ids = row_ids(out)
        assert len(ids) == k and len(set(ids)) == k and set(ids) <= set(range(n))
        assert out.lengths.tolist() == [LENGTHS[i] for i in ids]
    everything = row_ids(traj.sample(n, generator=torch.Generator().manual_seed(1)))
    assert sorted(everything) == list(range(n))


def test_sample_with_replacement(traj: Trajectories) -> None:
    n = traj.n_elems()
    out = traj.sample(4 * n, generator=torch.Generator().manual_seed(3), replace=True)
    ids = row_ids(out)
    assert len(ids) == 4 * n and set(ids) <= set(range(n))
    assert len(set(ids)) < len(ids)  # pigeonhole: more draws than rows must repeat
    assert out.lengths.tolist() == [LENGTHS[i] for i in ids]
    assert traj.sample(2).n_elems() == 2  # default generator works too


# ----------------------------------------------------------------------------------------------
# Error paths


def test_construction_errors() -> None:
    traj = TemporalDictTensor({"x": torch.zeros(3, 2)})
    with pytest.raises(ShapeError, match="info has 2 rows, trajectories has 3"):
        Trajectories(DictTensor({"env_id": torch.arange(2)}), traj)
    with pytest.raises(
        DeviceContractError, match="info is on meta but trajectories are on cpu"
    ) as info:
        Trajectories(DictTensor({"env_id": torch.arange(3, device="meta")}), traj)
    assert info.value.key == "info"
    assert info.value.expected == torch.device("cpu")
    assert info.value.actual == torch.device("meta")
    with pytest.raises(TypeError, match="info must be a DictTensor, got dict"):
        Trajectories({"env_id": torch.arange(3)}, traj)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a TemporalDictTensor, got DictTensor"):
        Trajectories(DictTensor(), DictTensor({"x": torch.zeros(3, 2)}))  # type: ignore[arg-type]


def test_sample_errors(traj: Trajectories) -> None:
    n = traj.n_elems()
    with pytest.raises(ShapeError, match=f"cannot sample {n + 1} rows out of {n} without"):
        traj.sample(n + 1)
    with pytest.raises(ShapeError, match=f"cannot sample -1 rows out of {n}"):
        traj.sample(-1)
    empty = Trajectories(DictTensor(), TemporalDictTensor(n_timesteps=2))
    with pytest.raises(ShapeError, match="cannot sample rows from empty Trajectories"):
        empty.sample(1, replace=True)


def test_index_and_cat_errors(device: torch.device) -> None:
    tr = make_traj([1, 2], 2, device)
    with pytest.raises(IndexError, match="row 2 is out of range for a batch of 2 rows"):
        tr.index(2)
    with pytest.raises(ValueError, match="at least one"):
        Trajectories.cat([])
    with pytest.raises(KeyMismatchError, match="item 1 has keys"):
        Trajectories.cat([tr, make_traj([1], 2, device, with_info=False)])

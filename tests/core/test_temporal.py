"""Tests of TemporalDictTensor over a catalogue of ragged variants.

Expected values come from plain python loops over the raw ``(B, T, *feat)`` tensors and the
``lengths`` list, never from the container under test. The `device` fixture (cpu, plus cuda when
available) comes from tests/conftest.py; the `meta` device stands in for "another device".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch

from rlstruct import DictTensor, TemporalDictTensor
from rlstruct.errors import DeviceContractError, KeyMismatchError, ShapeError

BIG = 2**53 + 1  # odd int64 values above 2**53 do not survive a float detour

#: key -> (feature shape, dtype); (B, T, *feat) tensors of rank 2 to 4.
SCHEMA: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    "observation/frame": ((2, 2), torch.uint8),
    "observation/reward": ((), torch.float32),
    "observation/done": ((), torch.bool),
    "action/action": ((), torch.int64),
    "action/logits": ((2,), torch.float64),
}


def rand_tensor(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if dtype == torch.uint8:
        return torch.randint(1, 256, shape, generator=gen, dtype=torch.uint8)  # never 0
    if dtype == torch.int64:
        return BIG + 2 * torch.randint(0, 1000, shape, generator=gen)
    return torch.randn(shape, generator=gen, dtype=dtype) + 10.0  # never 0


def make_seq(b: int, t: int, device, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: rand_tensor((b, t, *f), d, gen).to(device) for k, (f, d) in SCHEMA.items()}


@dataclass
class Case:
    name: str
    raw: dict[str, torch.Tensor]
    lengths: list[int]
    T: int
    tdt: TemporalDictTensor

    @property
    def n(self) -> int:
        return len(self.lengths)


#: name -> (B, T, lengths or None for "full", with keys)
VARIANTS: dict[str, tuple[int, int, list[int] | None, bool]] = {
    "full_none": (3, 4, None, True),
    "ragged": (5, 4, [0, 4, 2, 1, 4], True),  # 0 and T included
    "b1_full": (1, 3, [3], True),
    "b1_zero": (1, 3, [0], True),
    "b0": (0, 4, [], True),
    "t0": (2, 0, [0, 0], True),
    "nokeys": (3, 3, [2, 0, 3], False),
}


def build_case(name: str, device: torch.device) -> Case:
    b, t, lengths, with_keys = VARIANTS[name]
    raw = make_seq(b, t, device) if with_keys else {}
    if lengths is None:
        tdt = TemporalDictTensor(raw)
        lengths = [t] * b
    elif with_keys:
        tdt = TemporalDictTensor(raw, torch.tensor(lengths, dtype=torch.long, device=device))
    else:
        tdt = TemporalDictTensor(
            lengths=torch.tensor(lengths, dtype=torch.long, device=device), n_timesteps=t
        )
    return Case(name, raw, lengths, t, tdt)


@pytest.fixture(params=list(VARIANTS))
def case(request: pytest.FixtureRequest, device: torch.device) -> Case:
    return build_case(request.param, device)


@pytest.fixture(params=["ragged", "full_none", "b1_full"])
def rows_case(request: pytest.FixtureRequest, device: torch.device) -> Case:
    return build_case(request.param, device)


def same_device(dev: torch.device | None, expected: torch.device) -> bool:
    return dev is not None and dev.type == expected.type


def assert_tdt(
    tdt: TemporalDictTensor,
    raw: dict[str, torch.Tensor],
    rows: list[int],
    lengths: list[int],
    t_range: tuple[int, int] | None = None,
) -> None:
    """``tdt`` holds rows ``rows`` (steps ``t_range``) of ``raw`` and has ``lengths``."""
    assert list(tdt.keys()) == list(raw)
    assert tdt.n_elems() == len(rows)
    assert tdt.lengths.dtype == torch.int64
    assert tdt.lengths.tolist() == lengths
    for k, v in raw.items():
        a, b = t_range if t_range is not None else (0, v.shape[1])
        got = tdt[k]
        assert got.dtype == v.dtype and got.device == v.device, k
        assert got.shape == (len(rows), b - a, *v.shape[2:]), k
        assert tdt.n_timesteps() == b - a
        for i, r in enumerate(rows):
            for t in range(a, b):
                assert torch.equal(got[i, t - a], v[r, t]), (k, i, r, t)


# ----------------------------------------------------------------------------------------------
# Construction and description


def test_construction(case: Case, device: torch.device) -> None:
    tdt = case.tdt
    assert tdt.n_elems() == case.n
    assert tdt.n_timesteps() == case.T
    assert tdt.lengths.tolist() == case.lengths
    assert tdt.lengths.dtype == torch.int64
    assert same_device(tdt.lengths.device, device)
    assert same_device(tdt.device(), device)
    assert list(tdt.keys()) == list(case.raw)
    assert list(tdt) == list(case.raw)
    assert [k for k, _ in tdt.items()] == list(case.raw)
    for k, v in case.raw.items():
        assert k in tdt and tdt[k] is v
    assert all(a is b for a, b in zip(tdt.values(), case.raw.values()))
    assert tdt.specs() == (
        {k: (torch.Size(f), d) for k, (f, d) in SCHEMA.items()} if case.raw else {}
    )
    assert tdt.full() == all(x == case.T for x in case.lengths)


def test_construction_from_dicttensor_and_int32_lengths(device: torch.device) -> None:
    raw = make_seq(2, 3, device)
    tdt = TemporalDictTensor(
        DictTensor(raw), torch.tensor([1, 3], dtype=torch.int32, device=device)
    )
    assert tdt.lengths.dtype == torch.int64 and tdt.lengths.tolist() == [1, 3]
    assert list(tdt.keys()) == list(raw)


def test_lengths_only_takes_t_from_max_length(device: torch.device) -> None:
    tdt = TemporalDictTensor(lengths=torch.tensor([2, 5, 1], device=device))
    assert tdt.n_timesteps() == 5 and tdt.n_elems() == 3 and same_device(tdt.device(), device)
    empty = TemporalDictTensor(n_timesteps=4)
    assert empty.n_elems() == 0 and empty.n_timesteps() == 4


def test_set_and_unset(case: Case, device: torch.device) -> None:
    tdt = case.tdt
    new = torch.zeros(case.n, case.T, 3, dtype=torch.int16, device=device)
    tdt["extra/x"] = new
    assert tdt["extra/x"] is new and tdt.specs()["extra/x"] == (torch.Size([3]), torch.int16)
    assert tdt.unset("extra/x") is tdt and "extra/x" not in tdt


def test_mask(case: Case, device: torch.device) -> None:
    m = case.tdt.mask()
    assert m.dtype == torch.bool and m.shape == (case.n, case.T)
    assert same_device(m.device, device)
    expected = [[t < case.lengths[b] for t in range(case.T)] for b in range(case.n)]
    assert m.tolist() == expected


def test_repr(case: Case) -> None:
    text = repr(case.tdt)
    assert text.startswith("TemporalDictTensor(")
    assert f"B={case.n}" in text and f"T={case.T}" in text
    lines = text.splitlines()
    for k, v in case.raw.items():
        (line,) = [ln for ln in lines if f"{k}:" in ln]
        assert str(tuple(v.shape)) in line and str(v.dtype).replace("torch.", "") in line


def test_repr_does_not_read_values() -> None:
    tdt = TemporalDictTensor(
        {"observation/frame": torch.empty(2, 5, 84, 84, dtype=torch.uint8, device="meta")},
        torch.empty(2, dtype=torch.long, device="meta"),
        n_timesteps=5,
    )
    text = repr(tdt)
    assert "observation/frame: (2, 5, 84, 84) uint8" in text and "meta" in text


# ----------------------------------------------------------------------------------------------
# Rows


def test_get(case: Case) -> None:
    keys = [k for k in case.raw if k.startswith("action/")]
    out = case.tdt.get(keys)
    assert list(out.keys()) == keys and out.n_timesteps() == case.T
    assert out.lengths.tolist() == case.lengths
    for k in keys:
        assert out[k] is case.raw[k]
    cloned = case.tdt.get(keys, clone=True)
    cloned.lengths.zero_()
    assert case.tdt.lengths.tolist() == case.lengths  # clone=True copies lengths too
    for k in keys:
        assert torch.equal(cloned[k], case.raw[k])


def test_clone(case: Case) -> None:
    before = {k: v.clone() for k, v in case.raw.items()}
    c = case.tdt.clone()
    assert c.equal(case.tdt) and c.n_timesteps() == case.T
    c.lengths.zero_()
    for v in c.values():
        v.zero_()
    assert case.tdt.lengths.tolist() == case.lengths
    for k, v in case.raw.items():
        assert torch.equal(v, before[k])  # writes to the clone never reach the original


@pytest.mark.parametrize("a, b", [(0, None), (-1, None), (1, 3), (0, 99), (2, 2), (3, 1)])
def test_slice(case: Case, a: int, b: int | None) -> None:
    n = case.n
    if b is None and not -n <= a < n:
        with pytest.raises(IndexError, match="out of range"):
            case.tdt.slice(a, b)
        return
    rows = [a % n] if b is None else list(range(n))[a:b]
    out = case.tdt.slice(a, b)
    assert_tdt(out, case.raw, rows, [case.lengths[r] for r in rows])


def test_index(case: Case, device: torch.device) -> None:
    n = case.n
    forms: list[tuple[object, list[int]]] = [([], []), (torch.zeros(n, dtype=torch.bool), [])]
    if n:
        rows = [n - 1, 0, n - 1]
        mask = [i % 2 == 0 for i in range(n)]
        chosen = [i for i in range(n) if mask[i]]
        forms += [
            (0, [0]),
            (-1, [n - 1]),
            (rows, rows),
            (torch.tensor(rows), rows),
            (torch.tensor(rows, device=device), rows),
            (torch.tensor(mask, device=device), chosen),
            (mask, chosen),
        ]
    for idx, rows in forms:
        out = case.tdt.index(idx)
        assert out.n_timesteps() == case.T
        assert_tdt(out, case.raw, rows, [case.lengths[r] for r in rows])
        assert same_device(out.lengths.device, device)


def test_unfold(case: Case) -> None:
    parts = case.tdt.unfold()
    assert len(parts) == case.n
    for b, p in enumerate(parts):
        length = case.lengths[b]
        assert p.n_elems() == 1 and p.n_timesteps() == length  # shortened to its own length
        assert_tdt(p, case.raw, [b], [length], (0, length))


def test_expand(case: Case, device: torch.device) -> None:
    assert case.tdt.expand(case.n) is case.tdt
    out = case.tdt.expand(case.n + 2)
    assert out.n_elems() == case.n + 2 and out.n_timesteps() == case.T
    assert out.lengths.tolist() == case.lengths + [0, 0]
    assert same_device(out.lengths.device, device) and same_device(out.device(), device)
    for k, v in case.raw.items():
        assert out[k].dtype == v.dtype  # padding keeps each tensor's dtype
        assert torch.equal(out[k][: case.n], v)
        assert not out[k][case.n :].any()
    assert case.tdt.n_elems() == case.n  # the original is untouched


# ----------------------------------------------------------------------------------------------
# Time


def test_shorten(case: Case) -> None:
    t = max(case.lengths, default=0)
    out = case.tdt.shorten()
    if t == case.T:
        assert out is case.tdt
    assert out.n_timesteps() == t
    assert_tdt(out, case.raw, list(range(case.n)), case.lengths, (0, t))


@pytest.mark.parametrize("a, b", [(0, 0), (0, 2), (1, 3), (2, 4), (0, 4), (3, 3)])
def test_temporal_slice(case: Case, a: int, b: int) -> None:
    if b > case.T:
        with pytest.raises(IndexError, match=rf"temporal_slice\({a}, {b}\).*T={case.T}"):
            case.tdt.temporal_slice(a, b)
        return
    out = case.tdt.temporal_slice(a, b)
    lengths = [min(max(x - a, 0), b - a) for x in case.lengths]
    assert_tdt(out, case.raw, list(range(case.n)), lengths, (a, b))


def test_temporal_index(case: Case, device: torch.device) -> None:
    for t in range(-case.T, case.T):
        out = case.tdt.temporal_index(t)
        assert isinstance(out, DictTensor) and out.n_elems() == case.n
        step = t % case.T
        for k, v in case.raw.items():
            assert out[k].shape == (case.n, *v.shape[2:]) and out[k].dtype == v.dtype
            for b in range(case.n):
                assert torch.equal(out[k][b], v[b, step])
        d, m = case.tdt.masked_temporal_index(t)
        assert m.dtype == torch.bool and same_device(m.device, device)
        assert m.tolist() == [step < x for x in case.lengths]
        assert d.equal(out)


def test_temporal_multi_index(case: Case, device: torch.device) -> None:
    if case.T == 0:
        return
    steps = [(3 * b + 1) % case.T for b in range(case.n)]
    for t in (steps, torch.tensor(steps), torch.tensor(steps, device=device)):
        out = case.tdt.temporal_multi_index(t)
        assert out.n_elems() == case.n
        for k, v in case.raw.items():
            for b in range(case.n):
                assert torch.equal(out[k][b], v[b, steps[b]])


def test_last(case: Case) -> None:
    if any(x == 0 for x in case.lengths):
        zero_rows = [b for b, x in enumerate(case.lengths) if x == 0]
        with pytest.raises(ShapeError, match=re.escape(f"rows {zero_rows} have length 0")):
            case.tdt.last()
        return
    out = case.tdt.last()
    assert out.n_elems() == case.n
    for k, v in case.raw.items():
        for b in range(case.n):
            assert torch.equal(out[k][b], v[b, case.lengths[b] - 1])


def test_to_transitions(case: Case, device: torch.device) -> None:
    out = case.tdt.to_transitions()
    total = sum(case.lengths)
    assert out.n_elems() == total
    for k, v in case.raw.items():
        expected = [v[b, t] for b in range(case.n) for t in range(case.lengths[b])]  # row-major
        assert out[k].shape == (total, *v.shape[2:]) and out[k].dtype == v.dtype
        assert same_device(out[k].device, device)
        for i, e in enumerate(expected):
            assert torch.equal(out[k][i], e), (k, i)


# ----------------------------------------------------------------------------------------------
# Whole


def test_apply(case: Case) -> None:
    out = case.tdt.apply(lambda t: t.double() + 1)
    assert out.lengths.tolist() == case.lengths and out.n_timesteps() == case.T
    for k, v in case.raw.items():
        assert out[k].dtype == torch.float64 and torch.equal(out[k], v.double() + 1)


def test_detach(device: torch.device) -> None:
    x = torch.randn(2, 3, device=device, requires_grad=True)
    tdt = TemporalDictTensor({"x": x * 2}, torch.tensor([3, 1], device=device))
    d = tdt.detach()
    assert not d["x"].requires_grad and d["x"].data_ptr() == tdt["x"].data_ptr()
    assert d.lengths.tolist() == [3, 1] and d.n_timesteps() == 3


def test_to(case: Case, device: torch.device) -> None:
    assert case.tdt.to(device) is case.tdt
    assert case.tdt.to(device.type, non_blocking=True) is case.tdt
    moved = case.tdt.to("meta")
    assert moved is not case.tdt
    assert moved.device() == torch.device("meta") and moved.lengths.is_meta
    assert moved.n_elems() == case.n and moved.n_timesteps() == case.T
    assert moved.specs() == case.tdt.specs()


@pytest.mark.gpu
def test_to_cuda_roundtrip() -> None:
    raw = make_seq(3, 4, "cpu")
    tdt = TemporalDictTensor(raw, torch.tensor([4, 0, 2]))
    on_gpu = tdt.to("cuda")
    assert on_gpu.device().type == "cuda" and on_gpu.lengths.device.type == "cuda"
    assert on_gpu.to("cpu").equal(tdt)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinning needs an accelerator")
def test_pin_memory() -> None:
    tdt = TemporalDictTensor(make_seq(2, 3, "cpu"), torch.tensor([3, 1]))
    pinned = tdt.pin_memory()
    assert pinned.lengths.is_pinned() and all(v.is_pinned() for v in pinned.values())
    assert pinned.equal(tdt)


def test_full(device: torch.device) -> None:
    raw = make_seq(2, 3, device)
    assert TemporalDictTensor(raw).full()
    assert TemporalDictTensor(raw, torch.tensor([3, 3], device=device)).full()
    assert not TemporalDictTensor(raw, torch.tensor([3, 2], device=device)).full()


def test_equal_ignores_padding(rows_case: Case, device: torch.device) -> None:
    tdt = rows_case.tdt
    assert tdt.equal(tdt.clone())
    assert not tdt.equal("nope")  # type: ignore[arg-type]
    padded = tdt.clone()
    for v in padded.values():
        for b, x in enumerate(rows_case.lengths):
            v[b, x:] = 0  # rewrite the padding only
    assert tdt.equal(padded)
    # A longer T with the same valid steps is still equal (the extra steps are padding).
    n, t = rows_case.n, rows_case.T
    longer = TemporalDictTensor(
        {
            k: torch.ones(1, t + 2, *v.shape[2:], dtype=v.dtype, device=device)
            for k, v in rows_case.raw.items()
        },
        torch.zeros(1, dtype=torch.long, device=device),
    )
    wide = TemporalDictTensor.cat([tdt, longer]).slice(0, n)
    assert wide.n_timesteps() == t + 2
    assert tdt.equal(wide) and wide.equal(tdt)
    # A valid step that differs, other lengths, other keys: not equal.
    b = max(range(rows_case.n), key=lambda i: rows_case.lengths[i])
    changed = tdt.clone()
    changed["observation/reward"][b, 0] += 1.0
    assert not tdt.equal(changed)
    assert tdt.equal(changed, atol=1.5)
    other_len = tdt.clone()
    other_len.lengths[b] -= 1
    assert not tdt.equal(other_len)
    assert not tdt.equal(tdt.get(["action/action"]))


def test_copy_(rows_case: Case, device: torch.device) -> None:
    n = rows_case.n
    dst = TemporalDictTensor(
        {k: torch.zeros_like(v) for k, v in rows_case.raw.items()},
        torch.zeros(n, dtype=torch.long, device=device),
    )
    dst.copy_(rows_case.tdt, torch.arange(n).flip(0), torch.arange(n))
    for k, v in rows_case.raw.items():
        for b in range(n):
            assert torch.equal(dst[k][b], v[n - 1 - b])
    assert dst.lengths.tolist() == rows_case.lengths[::-1]
    # An int index copies one row.
    dst.copy_(rows_case.tdt, 0, n - 1)
    assert dst.lengths.tolist()[n - 1] == rows_case.lengths[0]


def test_copy_from_shorter_source(device: torch.device) -> None:
    dst = TemporalDictTensor(
        {k: torch.zeros_like(v) for k, v in make_seq(3, 5, device).items()},
        torch.zeros(3, dtype=torch.long, device=device),
    )
    src_raw = make_seq(2, 3, device, seed=4)
    src = TemporalDictTensor(src_raw, torch.tensor([3, 2], device=device))
    dst.copy_(src, torch.tensor([1, 0]), torch.tensor([0, 2]))
    assert dst.lengths.tolist() == [2, 0, 3]
    for k, v in src_raw.items():
        assert torch.equal(dst[k][0, :3], v[1]) and torch.equal(dst[k][2, :3], v[0])
        assert not dst[k][:, 3:].any() and not dst[k][1].any()


@pytest.mark.parametrize("times", [[4], [4, 2], [1, 4, 0], [3, 3]])
def test_cat_pads_with_zeros_of_each_dtype(device: torch.device, times: list[int]) -> None:
    parts, lengths = [], []
    for i, t in enumerate(times):
        raw = make_seq(i + 1, t, device, seed=i)
        ln = [min(t, j + 1) for j in range(i + 1)]
        parts.append((raw, ln))
        lengths += ln
    tdts = [TemporalDictTensor(raw, torch.tensor(ln, device=device)) for raw, ln in parts]
    out = TemporalDictTensor.cat(tdts)
    t_max = max(times)
    assert out.n_timesteps() == t_max and out.n_elems() == len(lengths)
    assert out.lengths.tolist() == lengths and same_device(out.device(), device)
    for k, (_, dtype) in SCHEMA.items():
        assert out[k].dtype == dtype
        row = 0
        for (raw, _), t in zip(parts, times):
            for b in range(raw[k].shape[0]):
                assert torch.equal(out[k][row, :t], raw[k][b])
                assert not out[k][row, t:].any()  # zero padding
                row += 1


def test_cat_without_keys() -> None:
    out = TemporalDictTensor.cat(
        [TemporalDictTensor(lengths=torch.tensor([1, 2])), TemporalDictTensor(n_timesteps=5)]
    )
    assert out.n_elems() == 2 and out.n_timesteps() == 5 and out.lengths.tolist() == [1, 2]


# ----------------------------------------------------------------------------------------------
# Error paths


def test_construction_errors() -> None:
    with pytest.raises(ShapeError, match="needs lengths or n_timesteps"):
        TemporalDictTensor()
    x = {"x": torch.zeros(2, 3)}
    with pytest.raises(TypeError, match="lengths must be a tensor, got list"):
        TemporalDictTensor(x, [3, 1])  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match=r"integer tensor, got torch\.float32"):
        TemporalDictTensor(x, torch.tensor([3.0, 1.0]))
    with pytest.raises(ShapeError, match=r"integer tensor, got torch\.bool"):
        TemporalDictTensor(x, torch.tensor([True, False]))
    with pytest.raises(ShapeError, match=r"lengths has shape \(3,\), expected \(2,\)"):
        TemporalDictTensor(x, torch.tensor([3, 1, 1]))
    with pytest.raises(ShapeError, match=r"lengths has shape \(\), expected \(2,\)"):
        TemporalDictTensor(x, torch.tensor(3))
    with pytest.raises(ShapeError, match=r"\[0, T=3\], got values in \[1, 4\]"):
        TemporalDictTensor(x, torch.tensor([4, 1]))
    with pytest.raises(ShapeError, match=r"\[0, T=3\], got values in \[-1, 2\]"):
        TemporalDictTensor(x, torch.tensor([-1, 2]))


def test_construction_device_errors() -> None:
    with pytest.raises(DeviceContractError, match="lengths is on meta, expected cpu") as info:
        TemporalDictTensor({"x": torch.zeros(2, 3)}, torch.tensor([1, 2], device="meta"))
    assert info.value.key == "lengths"
    assert info.value.expected == torch.device("cpu")
    assert info.value.actual == torch.device("meta")
    with pytest.raises(DeviceContractError, match="key 'y' is on meta, expected cpu") as info:
        TemporalDictTensor({"x": torch.zeros(2, 3), "y": torch.zeros(2, 3, device="meta")})
    assert info.value.key == "y"


def test_set_errors() -> None:
    tdt = TemporalDictTensor({"x": torch.zeros(2, 3)}, torch.tensor([3, 1]))
    with pytest.raises(ShapeError, match=r"key 'y' has shape \(2,\), expected \(B, T, \.\.\.\)"):
        tdt["y"] = torch.zeros(2)
    with pytest.raises(ShapeError, match=r"key 'y' has 4 time steps, expected T=3"):
        tdt["y"] = torch.zeros(2, 4)
    with pytest.raises(ShapeError, match=r"key 'y' has batch size 5, expected 2"):
        tdt["y"] = torch.zeros(5, 3)
    with pytest.raises(DeviceContractError, match=r"key 'y' is on meta, expected cpu"):
        tdt["y"] = torch.zeros(2, 3, device="meta")
    with pytest.raises(KeyMismatchError, match="cannot unset 'nope'"):
        tdt.unset("nope")
    with pytest.raises(TypeError, match="takes a key"):
        tdt[0]  # type: ignore[index]
    assert list(tdt.keys()) == ["x"]


def test_time_and_row_errors() -> None:
    tdt = TemporalDictTensor({"x": torch.zeros(2, 3)}, torch.tensor([3, 0]))
    with pytest.raises(IndexError, match=r"temporal_slice\(2, 1\) needs 0 <= a <= b <= T=3"):
        tdt.temporal_slice(2, 1)
    with pytest.raises(IndexError, match=r"time index 3 is out of range for T=3"):
        tdt.temporal_index(3)
    with pytest.raises(IndexError, match=r"time index -4 is out of range for T=3"):
        tdt.masked_temporal_index(-4)
    with pytest.raises(ShapeError, match=r"t has shape \(3,\), expected \(2,\)"):
        tdt.temporal_multi_index(torch.tensor([0, 0, 0]))
    with pytest.raises(IndexError, match=r"steps must lie in \[0, 3\)"):
        tdt.temporal_multi_index(torch.tensor([0, 3]))
    with pytest.raises(ShapeError, match=r"rows \[1\] have length 0"):
        tdt.last()
    with pytest.raises(ShapeError, match="new batch size 1 is smaller than the current 2"):
        tdt.expand(1)
    with pytest.raises(IndexError, match="row 2 is out of range for a batch of 2 rows"):
        tdt.index(2)
    with pytest.raises(IndexError, match="row -3 is out of range"):
        tdt.slice(-3)


def test_copy_errors() -> None:
    dst = TemporalDictTensor({"x": torch.zeros(2, 3), "y": torch.zeros(2, 3)})
    with pytest.raises(ShapeError, match="source has T=4, longer than the target's T=3"):
        dst.copy_(TemporalDictTensor({"x": torch.zeros(2, 4), "y": torch.zeros(2, 4)}), 0, 0)
    with pytest.raises(KeyMismatchError, match=r"source lacks keys \['y'\]"):
        dst.copy_(TemporalDictTensor({"x": torch.zeros(2, 3)}), 0, 0)


def test_cat_errors() -> None:
    a = TemporalDictTensor({"x": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match="at least one"):
        TemporalDictTensor.cat([])
    with pytest.raises(KeyMismatchError, match=r"item 1 has keys \['y'\], expected \['x'\]"):
        TemporalDictTensor.cat([a, TemporalDictTensor({"y": torch.zeros(2, 3)})])
    with pytest.raises(DeviceContractError, match="item 1 is on meta, expected cpu"):
        TemporalDictTensor.cat([a, a.to("meta")])
    with pytest.raises(ShapeError, match="cannot concatenate key 'x'"):
        TemporalDictTensor.cat([a, TemporalDictTensor({"x": torch.zeros(2, 3, 2)})])

"""Tests of DictTensor, masked_tensor and masked_dicttensor over a catalogue of variants.

Every expected value is computed from the raw tensors with plain torch (often row by row in a
python loop), never by the container under test. The `device` fixture (cpu, plus cuda when
available) comes from tests/conftest.py; the `meta` device stands in for "another device".
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from rlstruct import DictTensor, masked_dicttensor, masked_tensor
from rlstruct.errors import DeviceContractError, KeyMismatchError, RLStructError, ShapeError

#: Above 2**53 odd integers are not representable in float64: a float detour would corrupt them.
BIG = 2**53 + 1

#: key -> (feature shape, dtype); tensors of rank 1 to 4 once the batch dim is added.
SCHEMA: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    "observation/frame": ((3, 4, 2), torch.uint8),
    "observation/reward": ((), torch.float32),
    "observation/done": ((), torch.bool),
    "action/action": ((), torch.int64),
    "action/logits": ((2,), torch.float64),
    "agent_state/h": ((2, 3), torch.float32),
}


def rand_tensor(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    if dtype == torch.int64:
        return BIG + 2 * torch.randint(0, 1000, shape, generator=gen)  # odd, above 2**53
    return torch.randn(shape, generator=gen, dtype=dtype)


def make_tensors(b: int, device: torch.device | str, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: rand_tensor((b, *feat), dt, gen).to(device) for k, (feat, dt) in SCHEMA.items()}


@dataclass
class Case:
    """A variant: the raw tensors, the DictTensor built from them and the expected B."""

    name: str
    raw: dict[str, torch.Tensor]
    n: int
    batch_size: int | None
    dt: DictTensor


VARIANTS = ["empty", "empty_b5", "b0", "b1", "b5"]


def build_case(name: str, device: torch.device) -> Case:
    if name == "empty":
        return Case(name, {}, 0, None, DictTensor())
    if name == "empty_b5":
        return Case(name, {}, 5, 5, DictTensor(batch_size=5))
    b = int(name[1:])
    raw = make_tensors(b, device)
    return Case(name, raw, b, b, DictTensor(raw))


@pytest.fixture(params=VARIANTS)
def case(request: pytest.FixtureRequest, device: torch.device) -> Case:
    return build_case(request.param, device)


@pytest.fixture(params=["b1", "b5"])
def full_case(request: pytest.FixtureRequest, device: torch.device) -> Case:
    return build_case(request.param, device)


def assert_rows(dt: DictTensor, raw: dict[str, torch.Tensor], rows: list[int]) -> None:
    """``dt`` holds exactly rows ``rows`` of ``raw``, key by key, row by row."""
    assert list(dt.keys()) == list(raw.keys())
    assert dt.n_elems() == len(rows)
    for k, v in raw.items():
        got = dt[k]
        assert got.dtype == v.dtype, k
        assert got.device == v.device, k
        assert got.shape == (len(rows), *v.shape[1:]), k
        for i, r in enumerate(rows):
            assert torch.equal(got[i], v[r]), (k, i, r)


def same_device(dev: torch.device | None, expected: torch.device) -> bool:
    return dev is not None and dev.type == expected.type


# ----------------------------------------------------------------------------------------------
# Mapping protocol and description


def test_mapping_protocol(case: Case, device: torch.device) -> None:
    dt, raw = case.dt, case.raw
    assert list(dt.keys()) == list(raw)
    assert list(dt) == list(raw)
    assert [k for k, _ in dt.items()] == list(raw)
    for (k, v), w in zip(dt.items(), dt.values()):
        assert v is raw[k] and w is raw[k]  # no copy at construction
    for k in raw:
        assert k in dt
        assert dt[k] is raw[k]
    assert "missing" not in dt
    assert 3 not in dt


def test_description(case: Case, device: torch.device) -> None:
    dt = case.dt
    assert dt.n_elems() == case.n
    assert dt.batch_size == case.batch_size
    assert dt.empty() == (not case.raw)
    if case.raw:
        assert same_device(dt.device(), device)
        assert dt.specs() == {k: (torch.Size(f), d) for k, (f, d) in SCHEMA.items()}
    else:
        assert dt.device() is None
        assert dt.specs() == {}


def test_explicit_device_and_batch_size(device: torch.device) -> None:
    raw = make_tensors(3, device)
    dt = DictTensor(raw, batch_size=3, device=device)
    assert same_device(dt.device(), device) and dt.n_elems() == 3
    assert DictTensor(batch_size=0).n_elems() == 0
    assert DictTensor(batch_size=0).batch_size == 0
    # A DictTensor is a valid source of tensors for another one.
    again = DictTensor(dt)
    assert list(again.keys()) == list(raw) and all(again[k] is raw[k] for k in raw)


@pytest.mark.parametrize("key", [0, 1.5, slice(0, 1), ("a",)])
def test_getitem_non_str_raises_type_error(case: Case, key: object) -> None:
    with pytest.raises(TypeError, match="takes a key"):
        case.dt[key]


def test_getitem_tensor_key_raises_type_error(full_case: Case) -> None:
    with pytest.raises(TypeError, match=r"use \.index"):
        full_case.dt[torch.tensor([0])]


def test_setitem_delitem(case: Case, device: torch.device) -> None:
    dt = case.dt
    b = case.n
    new = torch.arange(b, device=device, dtype=torch.int32)
    dt["extra/x"] = new
    assert dt["extra/x"] is new and "extra/x" in dt
    assert list(dt.keys())[-1] == "extra/x"
    assert dt.n_elems() == b and same_device(dt.device(), device)
    # Replacing a key keeps its position and the batch size.
    repl = torch.zeros(b, 7, device=device)
    first = next(iter(case.raw)) if case.raw else "extra/x"
    dt[first] = repl
    assert dt[first] is repl and next(iter(dt.keys())) == first
    del dt["extra/x"]
    assert "extra/x" not in dt
    with pytest.raises(KeyMismatchError, match="extra/x"):
        del dt["extra/x"]


def test_set_on_empty_takes_batch_size_and_device(device: torch.device) -> None:
    dt = DictTensor()
    dt.set("a", torch.zeros(4, 2, device=device))
    assert dt.n_elems() == 4 and same_device(dt.device(), device)


def test_unset_and_unset_key(case: Case) -> None:
    dt = case.dt
    assert dt.unset_key("observation/") is dt
    assert list(dt.keys()) == [k for k in case.raw if not k.startswith("observation/")]
    if case.raw:
        assert dt.unset("action/action") is dt
        assert "action/action" not in dt
    assert dt.unset_key("nothing/") is dt  # no match: nothing removed, no error
    assert dt.n_elems() == case.n  # rows outlive keys


# ----------------------------------------------------------------------------------------------
# New DictTensors


def test_get(case: Case) -> None:
    dt = case.dt
    keys = [k for k in case.raw if k.startswith("action/")]
    shared = dt.get(keys)
    assert list(shared.keys()) == keys and shared.n_elems() == case.n
    for k in keys:
        assert shared[k] is case.raw[k]
    copied = dt.get(keys, clone=True)
    for k in keys:
        assert torch.equal(copied[k], case.raw[k])
        assert copied[k].data_ptr() != case.raw[k].data_ptr() or case.raw[k].numel() == 0
    if case.raw:
        one = dt.get("observation/reward")
        assert list(one.keys()) == ["observation/reward"]


def test_clone_is_deep(case: Case) -> None:
    before = {k: v.clone() for k, v in case.raw.items()}
    c = case.dt.clone()
    assert c is not case.dt
    assert c.n_elems() == case.n and c.batch_size == case.batch_size
    for k, v in c.items():
        assert torch.equal(v, before[k]) and v.dtype == before[k].dtype
        if v.numel():
            assert v.data_ptr() != case.raw[k].data_ptr()
            v.zero_() if v.dtype != torch.bool else v.logical_not_()
    for k, v in case.raw.items():  # the original is untouched by writes to the clone
        assert torch.equal(v, before[k])


def test_detach(device: torch.device) -> None:
    x = torch.randn(3, 2, device=device, requires_grad=True)
    y = x * 2
    dt = DictTensor({"y": y, "i": torch.arange(3, device=device)})
    d = dt.detach()
    assert not d["y"].requires_grad and d["y"].grad_fn is None
    assert d["y"].data_ptr() == y.data_ptr()  # same storage
    assert torch.equal(d["i"], dt["i"]) and d.n_elems() == 3
    assert DictTensor(batch_size=2).detach().n_elems() == 2


def test_apply(case: Case, device: torch.device) -> None:
    out = case.dt.apply(lambda t: t.double() * 2)
    assert out.n_elems() == case.n and out.batch_size == case.batch_size
    for k, v in case.raw.items():
        assert out[k].dtype == torch.float64
        assert torch.equal(out[k], v.double() * 2)
    if case.raw:
        assert same_device(out.device(), device)
    if case.raw and case.n:
        # The result is checked: fn must keep every key's batch size.
        with pytest.raises(ShapeError, match=f"key 'observation/done' has batch size {2 * case.n}"):
            case.dt.apply(lambda t: torch.cat([t, t]) if t.dtype == torch.bool else t)


@pytest.mark.parametrize("a, b", [(0, None), (-1, None), (1, 3), (0, 99), (-3, -1), (3, 1), (0, 0)])
def test_slice(case: Case, a: int, b: int | None) -> None:
    n = case.n
    if b is None and not -n <= a < n:
        with pytest.raises(IndexError, match=f"row {a} is out of range for a batch of {n}"):
            case.dt.slice(a, b)
        return
    out = case.dt.slice(a, b)
    rows = [a % n] if b is None else list(range(n))[a:b]
    assert out.n_elems() == len(rows) and out.batch_size == len(rows)
    assert_rows(out, case.raw, rows)


def test_slice_single_row_keeps_batch_dim(full_case: Case) -> None:
    out = full_case.dt.slice(0)
    for k, v in full_case.raw.items():
        assert out[k].dim() == v.dim() and out[k].shape[0] == 1


def _index_forms(n: int, device: torch.device) -> list[tuple[object, list[int]]]:
    """(index, the rows it selects), the rows derived by hand from python semantics."""
    forms: list[tuple[object, list[int]]] = [([], []), (torch.zeros(0, dtype=torch.long), [])]
    forms.append((torch.zeros(n, dtype=torch.bool), []))
    if n:
        rows = [n - 1, 0, n - 1]  # repeats and order are kept
        forms += [
            (0, [0]),
            (-1, [n - 1]),
            (rows, rows),
            (tuple(rows), rows),
            (torch.tensor(rows), rows),
            (torch.tensor(rows, device=device), rows),
            (torch.tensor(rows, dtype=torch.int32), rows),
            (torch.tensor([-1]), [n - 1]),
        ]
        mask = [i % 2 == 0 for i in range(n)]
        chosen = [i for i in range(n) if mask[i]]
        forms += [
            (torch.tensor(mask), chosen),
            (torch.tensor(mask, device=device), chosen),
            (mask, chosen),  # a list of bools is a mask, not the rows 1 and 0
        ]
    return forms


def test_index(case: Case, device: torch.device) -> None:
    for idx, rows in _index_forms(case.n, device):
        out = case.dt.index(idx)
        assert out.n_elems() == len(rows), idx
        assert out.batch_size == len(rows), idx
        assert_rows(out, case.raw, rows)


def test_index_does_not_modify_source(full_case: Case) -> None:
    before = {k: v.clone() for k, v in full_case.raw.items()}
    out = full_case.dt.index(torch.tensor([0]))
    for v in out.values():
        v.zero_() if v.dtype != torch.bool else v.logical_not_()
    for k, v in full_case.raw.items():
        assert torch.equal(v, before[k])


def test_unfold(case: Case) -> None:
    parts = case.dt.unfold()
    assert len(parts) == case.n
    for i, p in enumerate(parts):
        assert p.batch_size == 1
        assert_rows(p, case.raw, [i])


def test_prepend_and_truncate_key(case: Case) -> None:
    pre = case.dt.prepend_key("agent_state/")
    assert list(pre.keys()) == ["agent_state/" + k for k in case.raw]
    assert pre.n_elems() == case.n
    for k, v in case.raw.items():
        assert pre["agent_state/" + k] is v
    back = pre.truncate_key("agent_state/")
    assert list(back.keys()) == list(case.raw)
    obs = case.dt.truncate_key("observation/")
    expected = [k[len("observation/") :] for k in case.raw if k.startswith("observation/")]
    assert list(obs.keys()) == expected and obs.n_elems() == case.n
    for k in expected:
        assert obs[k] is case.raw["observation/" + k]


def test_add(case: Case, device: torch.device) -> None:
    other = DictTensor({"extra/z": torch.arange(case.n, device=device)})
    out = case.dt + other
    assert list(out.keys()) == list(case.raw) + ["extra/z"]
    assert out.n_elems() == case.n
    assert out["extra/z"] is other["extra/z"]
    for k, v in case.raw.items():
        assert out[k] is v
    assert "extra/z" not in case.dt  # operands untouched
    # Adding an empty DictTensor on either side keeps everything.
    assert list((DictTensor() + case.dt).keys()) == list(case.raw)
    assert (case.dt + DictTensor()).n_elems() == case.n
    assert case.dt.__add__({"x": 1}) is NotImplemented


def test_copy_(full_case: Case, device: torch.device) -> None:
    n = full_case.n
    for src_idx, dst_idx, src_rows, dst_rows in [
        (0, n - 1, [0], [n - 1]),
        ([0], [n - 1], [0], [n - 1]),
        (torch.tensor([0, 0]), torch.tensor([n - 1, 0]), [0, 0], [n - 1, 0]),
        (torch.arange(n).flip(0), torch.arange(n), list(range(n))[::-1], list(range(n))),
        (torch.ones(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool), range(n), range(n)),
    ]:
        dst = DictTensor({k: torch.zeros_like(v) for k, v in full_case.raw.items()})
        src = full_case.dt.clone()
        src["unused/extra"] = torch.zeros(n, device=device)  # extra source keys are ignored
        dst.copy_(src, src_idx, dst_idx)
        for k, v in full_case.raw.items():
            expected = torch.zeros_like(v)
            for s, d in zip(src_rows, dst_rows):
                expected[d] = v[s]
            assert torch.equal(dst[k], expected), (k, src_idx, dst_idx)


def test_copy_into_empty_is_a_no_op(device: torch.device) -> None:
    src = DictTensor(make_tensors(2, device))
    before = src.clone()
    dst = DictTensor(batch_size=2)
    dst.copy_(src, [0], [1])  # no key to write
    assert dst.empty() and dst.n_elems() == 2 and list(dst.keys()) == []
    assert src.equal(before)  # the source is read, never written


# ----------------------------------------------------------------------------------------------
# Several DictTensors


@pytest.mark.parametrize("sizes", [[5], [2, 3], [0, 4, 1], [1, 1, 1, 1, 1, 1, 1, 1]])
def test_cat(device: torch.device, sizes: list[int]) -> None:
    parts = [make_tensors(b, device, seed=i) for i, b in enumerate(sizes)]
    out = DictTensor.cat([DictTensor(p) for p in parts])
    assert out.n_elems() == sum(sizes) and out.batch_size == sum(sizes)
    assert same_device(out.device(), device)
    assert list(out.keys()) == list(SCHEMA)
    rows = [(i, r) for i, b in enumerate(sizes) for r in range(b)]
    for k in SCHEMA:
        assert out[k].dtype == parts[0][k].dtype
        for j, (i, r) in enumerate(rows):
            assert torch.equal(out[k][j], parts[i][k][r])


def test_cat_of_empties_adds_batch_sizes() -> None:
    out = DictTensor.cat([DictTensor(batch_size=2), DictTensor(batch_size=3)])
    assert out.empty() and out.n_elems() == 5
    assert DictTensor.cat([DictTensor()]).n_elems() == 0


def test_cat_keys_in_another_order(device: torch.device) -> None:
    a = make_tensors(2, device, seed=1)
    b = make_tensors(3, device, seed=2)
    rev = DictTensor(dict(reversed(list(b.items()))))
    out = DictTensor.cat([DictTensor(a), rev])
    for k in SCHEMA:
        assert torch.equal(out[k], torch.cat([a[k], b[k]]))


@pytest.mark.parametrize("n_items", [1, 3])
def test_stack_dim0(device: torch.device, n_items: int) -> None:
    parts = [make_tensors(4, device, seed=i) for i in range(n_items)]
    out = DictTensor.stack([DictTensor(p) for p in parts], dim=0)
    assert out.n_elems() == n_items and same_device(out.device(), device)
    for k in SCHEMA:
        assert out[k].shape == (n_items, 4, *SCHEMA[k][0]) and out[k].dtype == SCHEMA[k][1]
        for i in range(n_items):
            assert torch.equal(out[k][i], parts[i][k])


@pytest.mark.parametrize("n_steps", [1, 3])
def test_stack_dim1_makes_time_axis(device: torch.device, n_steps: int) -> None:
    steps = [make_tensors(5, device, seed=i) for i in range(n_steps)]
    out = DictTensor.stack([DictTensor(s) for s in steps], dim=1)
    assert out.n_elems() == 5
    for k in SCHEMA:
        assert out[k].shape == (5, n_steps, *SCHEMA[k][0])
        for b in range(5):
            for t in range(n_steps):
                assert torch.equal(out[k][b, t], steps[t][k][b])


def test_stack_of_empties() -> None:
    assert DictTensor.stack([DictTensor(batch_size=3)] * 2, dim=0).n_elems() == 2
    assert DictTensor.stack([DictTensor(batch_size=3)] * 2, dim=1).n_elems() == 3


# ----------------------------------------------------------------------------------------------
# Devices and memory


def test_to_same_device_returns_self(case: Case, device: torch.device) -> None:
    if not case.raw:
        moved = case.dt.to(device)
        assert moved.empty() and moved.n_elems() == case.n
        assert same_device(moved.device(), device)
        return
    assert case.dt.to(device) is case.dt
    assert case.dt.to(device.type) is case.dt
    assert case.dt.to(device, non_blocking=True) is case.dt
    if device.type == "cuda":
        assert case.dt.to("cuda:0") is case.dt


def test_to_other_device_copies(case: Case) -> None:
    # meta is a real "other device" on every machine: a copy without data.
    moved = case.dt.to("meta")
    assert moved is not case.dt
    assert moved.n_elems() == case.n and moved.batch_size == case.batch_size
    assert moved.device() == torch.device("meta")
    assert moved.specs() == case.dt.specs()
    for v in moved.values():
        assert v.is_meta


class _RecordingTensor(torch.Tensor):
    """A tensor that records the keyword arguments of every ``Tensor.to`` call made on it."""

    calls: ClassVar[list[dict]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.to:
            cls.calls.append(dict(kwargs or {}))
        return super().__torch_function__(func, types, args, kwargs)


@pytest.mark.parametrize("non_blocking", [False, True])
def test_to_forwards_non_blocking(non_blocking: bool) -> None:
    _RecordingTensor.calls = []
    t = torch.zeros(3, 2).as_subclass(_RecordingTensor)
    DictTensor({"a": t}).to("meta", non_blocking=non_blocking)
    assert _RecordingTensor.calls and all(
        c.get("non_blocking", False) is non_blocking for c in _RecordingTensor.calls
    )


@pytest.mark.gpu
def test_to_cuda_and_back_roundtrip() -> None:
    raw = make_tensors(5, "cpu")
    dt = DictTensor(raw)
    on_gpu = dt.to("cuda", non_blocking=True)
    assert on_gpu.device().type == "cuda"
    back = on_gpu.to("cpu")
    assert back.device() == torch.device("cpu")
    for k, v in raw.items():
        assert torch.equal(back[k], v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinning needs an accelerator")
def test_pin_memory() -> None:
    raw = make_tensors(3, "cpu")
    pinned = DictTensor(raw).pin_memory()
    for k, v in pinned.items():
        assert v.is_pinned() and torch.equal(v, raw[k])
    assert pinned.n_elems() == 3


def test_share_memory_() -> None:
    dt = DictTensor(make_tensors(3, "cpu"))
    before = dt.clone()
    assert dt.share_memory_() is dt
    for v in dt.values():
        assert v.is_shared()
    assert dt.equal(before)


# ----------------------------------------------------------------------------------------------
# equal and repr


def test_equal(case: Case, device: torch.device) -> None:
    dt = case.dt
    assert dt.equal(dt)
    assert dt.equal(dt.clone())
    assert not dt.equal("not a DictTensor")  # type: ignore[arg-type]
    with_more = dt.clone()
    with_more["extra"] = torch.zeros(case.n, device=device)
    assert not dt.equal(with_more) and not with_more.equal(dt)
    for k, v in case.raw.items():
        if v.numel() == 0:
            continue
        changed = dt.clone()
        t = changed[k].reshape(-1)
        t[0] = ~t[0] if v.dtype == torch.bool else t[0] + 1
        assert not dt.equal(changed), k
        retyped = dt.clone()
        retyped[k] = v.to(torch.int32 if v.dtype != torch.int32 else torch.int64)
        assert not dt.equal(retyped), k


def test_equal_other_batch_size(device: torch.device) -> None:
    assert not DictTensor(batch_size=2).equal(DictTensor(batch_size=3))
    a = DictTensor({"x": torch.zeros(2, device=device)})
    b = DictTensor({"x": torch.zeros(3, device=device)})
    assert not a.equal(b)
    c = DictTensor({"x": torch.zeros(2, 1, device=device)})
    assert not a.equal(c)  # same values, other shape


def test_equal_tolerances_and_nan(device: torch.device) -> None:
    x = torch.tensor([1.0, 2.0, float("nan"), float("inf")], dtype=torch.float64, device=device)
    a = DictTensor({"x": x, "i": torch.tensor([BIG, 1, 2, 3], device=device)})
    near = a.clone()
    near["x"] = x + torch.tensor([1e-6, 0.0, 0.0, 0.0], dtype=torch.float64, device=device)
    assert a.equal(a.clone())  # NaN == NaN, inf == inf
    assert not a.equal(near)  # exact by default
    assert a.equal(near, atol=1e-5)
    assert a.equal(near, rtol=1e-5)
    assert not a.equal(near, atol=1e-8)
    far_int = a.clone()
    far_int["i"] = far_int["i"] + torch.tensor([1, 0, 0, 0], device=device)  # 2**53+2
    assert not a.equal(far_int, atol=10.0)  # integers are compared exactly


def test_repr(case: Case) -> None:
    text = repr(case.dt)
    assert text.startswith("DictTensor(") and f"B={case.batch_size}" in text
    lines = text.splitlines()
    for k, v in case.raw.items():
        (line,) = [ln for ln in lines if f"{k}:" in ln]
        assert str(tuple(v.shape)) in line and str(v.dtype).replace("torch.", "") in line
    if not case.raw:
        assert "empty" in text


def test_repr_does_not_read_values() -> None:
    # meta tensors have no data: any read of values would raise.
    dt = DictTensor(
        {
            "observation/frame": torch.empty(2, 84, 84, 3, dtype=torch.uint8, device="meta"),
            "action/action": torch.empty(2, dtype=torch.int64, device="meta"),
        }
    )
    text = repr(dt)
    assert "observation/frame: (2, 84, 84, 3) uint8" in text
    assert "action/action: (2,) int64" in text
    assert "meta" in text


# ----------------------------------------------------------------------------------------------
# masked_tensor / masked_dicttensor


def _pair(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
    """Two tensors that differ at every entry (so a wrong choice is always visible)."""
    gen = torch.Generator().manual_seed(7)
    t0 = rand_tensor(shape, dtype, gen)
    if dtype == torch.bool:
        t1 = ~t0
    elif dtype == torch.int64:
        t1 = t0 + 2 * 1000 * 1000  # still odd and above 2**53
    elif dtype == torch.uint8:
        t1 = t0 + 1  # wraps 255 -> 0, still different
    else:
        t1 = t0 + 1
    return t0.to(device), t1.to(device)


MASK_ROWS = [1, 0, 0, 1, 1]


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.int32, torch.uint8])
@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.uint8, torch.bool, torch.float32, torch.float64]
)
@pytest.mark.parametrize("feat", [(), (3,), (2, 3), (2, 3, 2)])
def test_masked_tensor(device, feat, dtype, mask_dtype) -> None:
    t0, t1 = _pair((5, *feat), dtype, device)
    mask = torch.tensor(MASK_ROWS, dtype=mask_dtype, device=device)
    out = masked_tensor(t0, t1, mask)
    assert out.dtype == dtype and out.shape == t0.shape and out.device == t0.device
    for b, m in enumerate(MASK_ROWS):
        assert torch.equal(out[b], t1[b] if m else t0[b]), b


def test_masked_tensor_int64_exact_above_2_53(device: torch.device) -> None:
    lo, hi = 2**53 + 1, 2**62 + 1  # float64 would round both to even neighbours
    t0 = torch.full((3, 2), lo, dtype=torch.int64, device=device)
    t1 = torch.full((3, 2), hi, dtype=torch.int64, device=device)
    out = masked_tensor(t0, t1, torch.tensor([True, False, True]))  # mask on cpu is fine
    assert out.tolist() == [[hi, hi], [lo, lo], [hi, hi]]


def test_masked_tensor_empty_batch(device: torch.device) -> None:
    t = torch.zeros(0, 3, device=device)
    assert masked_tensor(t, t, torch.zeros(0, dtype=torch.bool)).shape == (0, 3)


def test_masked_dicttensor(device: torch.device) -> None:
    d0 = DictTensor(make_tensors(5, device, seed=1))
    d1 = DictTensor(make_tensors(5, device, seed=2))
    for mask in (
        torch.tensor(MASK_ROWS, device=device),
        torch.tensor(MASK_ROWS, dtype=torch.bool, device=device),
    ):
        out = masked_dicttensor(d0, d1, mask)
        assert list(out.keys()) == list(SCHEMA) and out.n_elems() == 5
        assert same_device(out.device(), device)
        for k in SCHEMA:
            assert out[k].dtype == SCHEMA[k][1]
            for b, m in enumerate(MASK_ROWS):
                assert torch.equal(out[k][b], (d1 if m else d0)[k][b]), (k, b)
    empty = masked_dicttensor(DictTensor(batch_size=5), DictTensor(batch_size=5), mask)
    assert empty.empty() and empty.n_elems() == 5


# ----------------------------------------------------------------------------------------------
# Error paths: typed errors whose messages name the key, the expected and the actual value.


def test_error_hierarchy() -> None:
    assert issubclass(ShapeError, ValueError) and issubclass(ShapeError, RLStructError)
    assert issubclass(KeyMismatchError, KeyError)
    assert issubclass(DeviceContractError, RuntimeError)


def test_construction_batch_size_mismatch_names_key_and_sizes() -> None:
    with pytest.raises(ShapeError, match=r"key 'b' has batch size 3, expected 2"):
        DictTensor({"a": torch.zeros(2), "b": torch.zeros(3, 4)})
    with pytest.raises(ShapeError, match=r"key 'a' has batch size 2, expected 5"):
        DictTensor({"a": torch.zeros(2)}, batch_size=5)


def test_construction_device_mismatch_names_key_and_devices() -> None:
    with pytest.raises(DeviceContractError, match=r"key 'b' is on meta, expected cpu") as info:
        DictTensor({"a": torch.zeros(2), "b": torch.zeros(2, device="meta")})
    err = info.value
    assert err.key == "b"
    assert err.expected == torch.device("cpu") and err.actual == torch.device("meta")
    with pytest.raises(DeviceContractError, match=r"key 'a' is on cpu, expected meta"):
        DictTensor({"a": torch.zeros(2)}, device="meta")


def test_scalar_tensor_raises_shape_error() -> None:
    with pytest.raises(ShapeError, match=r"key 'r'.*scalar.*\(B, \.\.\.\)"):
        DictTensor({"r": torch.tensor(1.0)})


def test_non_str_key_and_non_tensor_value_raise_type_error() -> None:
    with pytest.raises(TypeError, match=r"keys are str, got int \(3\)"):
        DictTensor({3: torch.zeros(2)})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"torch.Tensor, got list for key 'a'"):
        DictTensor({"a": [1, 2]})  # type: ignore[dict-item]


def test_rejected_write_leaves_dicttensor_unchanged() -> None:
    dt = DictTensor({"a": torch.zeros(2)})
    with pytest.raises(ShapeError, match=r"key 'b' has batch size 3, expected 2"):
        dt["b"] = torch.zeros(3)
    with pytest.raises(DeviceContractError, match=r"key 'a' is on meta, expected cpu"):
        dt["a"] = torch.ones(2, device="meta")
    assert list(dt.keys()) == ["a"] and torch.equal(dt["a"], torch.zeros(2))
    assert dt.n_elems() == 2 and dt.device() == torch.device("cpu")
    # An empty DictTensor with an expected device does not pick up the rejected batch size.
    empty = DictTensor(device="cpu")
    with pytest.raises(DeviceContractError, match="key 'x' is on meta, expected cpu"):
        empty["x"] = torch.zeros(3, device="meta")
    assert empty.batch_size is None and empty.empty()


def test_missing_key_errors_name_the_key() -> None:
    dt = DictTensor({"a": torch.zeros(2)})
    with pytest.raises(KeyMismatchError, match=r"no key 'zz' in DictTensor; keys are \['a'\]"):
        dt["zz"]
    with pytest.raises(KeyError):  # still a KeyError for `except KeyError`
        dt["zz"]
    with pytest.raises(KeyMismatchError, match=r"no key 'zz'"):
        dt.get(["a", "zz"])
    with pytest.raises(KeyMismatchError, match=r"cannot unset 'zz'"):
        dt.unset("zz")


def test_index_errors() -> None:
    dt = DictTensor({"a": torch.arange(5)})
    with pytest.raises(IndexError, match=r"row 5 is out of range for a batch of 5 rows"):
        dt.index(5)
    with pytest.raises(IndexError, match=r"row -6 is out of range for a batch of 5 rows"):
        dt.index(-6)
    with pytest.raises(IndexError, match="out of bounds"):
        dt.index(torch.tensor([7]))
    with pytest.raises(ShapeError, match=r"boolean row mask has shape \(4,\), expected \(5,\)"):
        dt.index(torch.ones(4, dtype=torch.bool))
    with pytest.raises(ShapeError, match=r"1-D integer or bool.*shape \(1, 2\)"):
        dt.index(torch.tensor([[0, 1]]))
    with pytest.raises(ShapeError, match=r"dtype torch.float32"):
        dt.index(torch.tensor([0.0]))
    with pytest.raises(ShapeError, match=r"dtype torch.float"):
        dt.index([1.5])  # never silently truncated to row 1
    with pytest.raises(TypeError, match="not a bool"):
        dt.index(True)
    with pytest.raises(TypeError, match="uint8"):
        dt.index(torch.tensor([1, 0, 1, 0, 0], dtype=torch.uint8))
    with pytest.raises(IndexError, match="cannot index 1 rows of an empty batch"):
        DictTensor().index(torch.tensor([0]))
    with pytest.raises(IndexError, match="row 0 is out of range for a batch of 0 rows"):
        DictTensor().slice(0)


def test_add_errors() -> None:
    a = DictTensor({"a": torch.zeros(2), "k": torch.zeros(2)})
    with pytest.raises(KeyMismatchError, match=r"share keys \['k'\]"):
        a + DictTensor({"k": torch.zeros(2), "z": torch.zeros(2)})
    with pytest.raises(ShapeError, match=r"batch sizes 2 and 3"):
        a + DictTensor({"z": torch.zeros(3)})
    with pytest.raises(ShapeError, match=r"batch sizes 2 and 3"):
        a + DictTensor(batch_size=3)
    with pytest.raises(DeviceContractError, match=r"key 'z' is on meta, expected cpu"):
        a + DictTensor({"z": torch.zeros(2, device="meta")})


def test_copy_missing_keys() -> None:
    dst = DictTensor({"a": torch.zeros(2), "b": torch.zeros(2)})
    with pytest.raises(KeyMismatchError, match=r"source lacks keys \['b'\]"):
        dst.copy_(DictTensor({"a": torch.ones(2)}), 0, 0)


def test_cat_errors() -> None:
    a = DictTensor({"a": torch.zeros(2, 3), "b": torch.zeros(2)})
    with pytest.raises(ValueError, match="at least one"):
        DictTensor.cat([])
    with pytest.raises(KeyMismatchError, match=r"item 1 has keys \['a'\], expected \['a', 'b'\]"):
        DictTensor.cat([a, DictTensor({"a": torch.zeros(2, 3)})])
    with pytest.raises(DeviceContractError, match=r"item 1 is on meta, expected cpu") as info:
        DictTensor.cat([a, a.to("meta")])
    assert info.value.actual == torch.device("meta")
    with pytest.raises(ShapeError, match=r"cannot concatenate key 'a'"):
        DictTensor.cat([a, DictTensor({"a": torch.zeros(2, 4), "b": torch.zeros(2)})])


def test_stack_errors() -> None:
    a = DictTensor({"a": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match="at least one"):
        DictTensor.stack([])
    with pytest.raises(ValueError, match="dim must be 0 or 1, got 2"):
        DictTensor.stack([a], dim=2)
    with pytest.raises(KeyMismatchError, match=r"item 1 has keys \['b'\], expected \['a'\]"):
        DictTensor.stack([a, DictTensor({"b": torch.zeros(2, 3)})])
    with pytest.raises(ShapeError, match=r"cannot stack key 'a'"):
        DictTensor.stack([a, DictTensor({"a": torch.zeros(2, 4)})])
    with pytest.raises(DeviceContractError, match=r"item 1 is on meta, expected cpu"):
        DictTensor.stack([a, a.to("meta")], dim=1)


def test_masked_errors() -> None:
    with pytest.raises(ShapeError, match=r"shapes differ: \(3, 2\) vs \(3, 1\)"):
        masked_tensor(torch.zeros(3, 2), torch.zeros(3, 1), torch.ones(3))
    with pytest.raises(ShapeError, match=r"mask has shape \(2,\), expected \(3,\)"):
        masked_tensor(torch.zeros(3, 2), torch.zeros(3, 2), torch.ones(2))
    with pytest.raises(ShapeError, match=r"mask has shape \(3, 1\), expected \(3,\)"):
        masked_tensor(torch.zeros(3, 2), torch.zeros(3, 2), torch.ones(3, 1))
    d = DictTensor({"a": torch.zeros(3), "b": torch.zeros(3)})
    with pytest.raises(KeyMismatchError, match=r"keys differ: \['a', 'b'\] vs \['a'\]"):
        masked_dicttensor(d, DictTensor({"a": torch.zeros(3)}), torch.ones(3))
    with pytest.raises(ShapeError, match=r"key 'b' has shapes \(3,\) and \(3, 2\)"):
        masked_dicttensor(
            d, DictTensor({"a": torch.zeros(3), "b": torch.zeros(3, 2)}), torch.ones(3)
        )
    with pytest.raises(ShapeError, match=r"masked_dicttensor key 'a': mask has shape \(2,\)"):
        masked_dicttensor(d, d, torch.ones(2))


@pytest.mark.slow
def test_checks_survive_python_dash_o() -> None:
    """R15: the invariant checks are raises, not asserts, so ``python -O`` keeps them."""
    code = (
        "import torch\n"
        "from rlstruct import DictTensor\n"
        "from rlstruct.errors import ShapeError\n"
        "try:\n"
        "    DictTensor({'a': torch.zeros(2), 'b': torch.zeros(3)})\n"
        "except ShapeError as e:\n"
        "    print('RAISED', e)\n"
        "else:\n"
        "    print('NOT RAISED')\n"
    )
    res = subprocess.run(
        [sys.executable, "-O", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert res.returncode == 0, res.stderr
    with pytest.raises(ShapeError) as info:
        DictTensor({"a": torch.zeros(2), "b": torch.zeros(3)})
    assert res.stdout.strip() == f"RAISED {info.value}"

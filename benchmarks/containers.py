"""Per-operation cost of the rlstruct containers vs a plain dict of tensors vs TensorDict.

Every operation is measured three ways in the same run, interleaved rep by rep so that machine
noise hits all of them alike:

* ``rlstruct``   -- ``DictTensor`` / ``TemporalDictTensor``;
* ``dict``       -- the hand-written dict comprehension a user would write instead (for the
  temporal ops the dict carries the ``lengths`` tensor beside the tensors, as a TDT does);
* ``tensordict`` -- ``tensordict.TensorDict`` (batch ``[B]``, or ``[B, T]`` for the temporal ops,
  lengths kept beside it); its row says "not installed" when the package is missing.

Before timing, the three results of each op are compared, so that the rows measure the same work.

Workload: an RL batch of ~10 keys, ``B=64`` rows, ``T=32`` steps, ragged lengths for
``to_transitions``. Targets (see ``BENCHMARKS.md``): each rlstruct op faster than TensorDict's
and within 2x of the plain dict; the summary prints PASS/MISS per op.

Usage::

    python benchmarks/containers.py                 # full run (~1 min)
    python benchmarks/containers.py --quick         # smoke run (a few seconds)
    python benchmarks/containers.py --json out.json # also write the results
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

# One intra-op thread, set before torch starts its pool (BENCHMARKS.md: pin thread counts).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from rlstruct import DictTensor, TemporalDictTensor

try:  # an optional peer (pip install -e .[bench])
    import tensordict as _tensordict_pkg
    from tensordict import TensorDict
except ImportError:  # pragma: no cover - depends on the environment
    _tensordict_pkg = None
    TensorDict = None

#: Speed targets for every op (BENCHMARKS.md keeps targets here, never in unit tests).
MAX_RATIO_VS_DICT = 2.0
MAX_RATIO_VS_TENSORDICT = 1.0

B, T, N_CAT = 64, 32, 8

#: key -> (feature shape, dtype): what a collected RL batch holds.
SCHEMA: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    "observation/frame": ((4,), torch.float32),
    "observation/reward": ((), torch.float32),
    "observation/done": ((), torch.bool),
    "observation/env_step": ((), torch.int64),
    "action/action": ((), torch.int64),
    "action/logits": ((2,), torch.float32),
    "action/value": ((), torch.float32),
    "_observation/frame": ((4,), torch.float32),
    "_observation/reward": ((), torch.float32),
    "_observation/terminated": ((), torch.bool),
    "_observation/truncated": ((), torch.bool),
}


@dataclass
class Timing:
    """Microseconds per call over the repetitions."""

    min_us: float
    median_us: float
    max_us: float
    number: int
    reps: int


@dataclass
class Row:
    """One operation: the three timings, the ratios and the verdict."""

    op: str
    description: str
    rlstruct: Timing
    dict: Timing
    tensordict: Timing | None
    tensordict_status: str
    ratio_vs_dict: float
    ratio_vs_tensordict: float | None
    verdict: str
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------- data
def make_tensors(batch: tuple[int, ...], gen: torch.Generator) -> dict[str, torch.Tensor]:
    out = {}
    for key, (feat, dtype) in SCHEMA.items():
        shape = batch + feat
        if dtype == torch.bool:
            out[key] = torch.rand(shape, generator=gen) < 0.1
        elif dtype == torch.int64:
            out[key] = torch.randint(0, 1000, shape, generator=gen)
        else:
            out[key] = torch.randn(shape, generator=gen, dtype=dtype)
    return out


def make_td(tensors: dict[str, torch.Tensor], batch: list[int]):
    if TensorDict is None:
        return None
    return TensorDict(dict(tensors), batch_size=batch)


# ------------------------------------------------------------------------------------- timing
def _autorange(fn: Callable[[], object], min_time: float) -> int:
    """Number of calls so that one repetition lasts at least ``min_time`` seconds."""
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - t0 >= min_time:
            return number
        number *= 2


def measure(
    fns: dict[str, Callable[[], object]], reps: int, min_time: float
) -> dict[str, Timing]:
    """Times every fn: a warm-up, then ``reps`` repetitions interleaved across the fns."""
    numbers = {}
    for name, fn in fns.items():
        for _ in range(3):  # warm-up (caches, lazy imports, allocator)
            fn()
        numbers[name] = _autorange(fn, min_time)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            n = numbers[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - t0) / n * 1e6)
    return {
        name: Timing(min(s), statistics.median(s), max(s), numbers[name], reps)
        for name, s in samples.items()
    }


# ------------------------------------------------------------------------------------- checks
def _as_plain(x) -> dict[str, torch.Tensor]:
    """A dict view of any of the three results (a TDT/tuple result keeps its lengths)."""
    if isinstance(x, tuple):  # (container, lengths)
        out = _as_plain(x[0])
        out["lengths"] = x[1]
        return out
    if isinstance(x, TemporalDictTensor):
        out = dict(x.items())
        out["lengths"] = x.lengths
        return out
    if isinstance(x, DictTensor):
        return dict(x.items())
    if isinstance(x, dict):
        return x
    return {k: x.get(k) for k in x.keys()}  # noqa: SIM118 (TensorDict: iterating needs keys())


def check_same(op: str, results: dict[str, object]) -> None:
    """Fails loudly when the implementations of an op do not compute the same thing."""
    ref_name, ref = next(iter(results.items()))
    ref = _as_plain(ref)
    for name, res in results.items():
        res = _as_plain(res)
        if set(res) != set(ref):
            raise RuntimeError(f"{op}: {name} has keys {sorted(res)}, {ref_name} {sorted(ref)}")
        for k in ref:
            a, b = ref[k], res[k]
            if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a.cpu(), b.cpu()):
                raise RuntimeError(f"{op}: {name} and {ref_name} differ on key {k!r}")


# ------------------------------------------------------------------------------------- ops
def build_ops(device_copy: str | None) -> list[tuple[str, str, dict[str, Callable[[], object]]]]:
    """``[(op, description, {impl: fn})]``; every fn does the whole operation once."""
    gen = torch.Generator().manual_seed(0)
    flat = make_tensors((B,), gen)
    dt = DictTensor(flat)
    td = make_td(flat, [B])

    seq = make_tensors((B, T), gen)
    full_lengths = torch.full((B,), T, dtype=torch.long)
    ragged = torch.randint(0, T + 1, (B,), generator=gen)
    ragged[0], ragged[1] = 0, T  # both extremes present
    tdt = TemporalDictTensor(seq, full_lengths)
    tdt_ragged = TemporalDictTensor(seq, ragged)
    td_seq = make_td(seq, [B, T])

    idx = torch.randperm(B, generator=gen)[: B // 2]
    a, b = B // 8, B // 8 + B // 2
    t_step = T // 3
    parts = [DictTensor(make_tensors((B,), gen)) for _ in range(N_CAT)]
    parts_plain = [dict(p.items()) for p in parts]
    parts_td = [make_td(dict(p.items()), [B]) for p in parts] if TensorDict else None
    keys = list(SCHEMA)
    steps = torch.arange(T)

    def dict_to_transitions():
        m = steps.unsqueeze(0) < ragged.unsqueeze(1)
        return {k: v[m] for k, v in seq.items()}

    def td_to_transitions():
        m = steps.unsqueeze(0) < ragged.unsqueeze(1)
        return td_seq[m]

    ops: list[tuple[str, str, dict[str, Callable[[], object]]]] = [
        (
            "index",
            f"rows of a LongTensor of B/2={B // 2} rows, B={B}",
            {
                "rlstruct": lambda: dt.index(idx),
                "dict": lambda: {k: v[idx] for k, v in flat.items()},
                "tensordict": (lambda: td[idx]) if td is not None else None,
            },
        ),
        (
            "slice",
            f"rows [{a}, {b}) of B={B}",
            {
                "rlstruct": lambda: dt.slice(a, b),
                "dict": lambda: {k: v[a:b] for k, v in flat.items()},
                "tensordict": (lambda: td[a:b]) if td is not None else None,
            },
        ),
        (
            "cat",
            f"{N_CAT} batches of B={B}",
            {
                "rlstruct": lambda: DictTensor.cat(parts),
                "dict": lambda: {k: torch.cat([p[k] for p in parts_plain]) for k in keys},
                "tensordict": (lambda: torch.cat(parts_td, 0)) if parts_td else None,
            },
        ),
        (
            "clone",
            f"deep copy, B={B}",
            {
                "rlstruct": lambda: dt.clone(),
                "dict": lambda: {k: v.clone() for k, v in flat.items()},
                "tensordict": (lambda: td.clone()) if td is not None else None,
            },
        ),
        (
            "to(cpu)",
            "to the device it is already on (the no-op path)",
            {
                "rlstruct": lambda: dt.to("cpu"),
                "dict": lambda: {k: v.to("cpu") for k, v in flat.items()},
                "tensordict": (lambda: td.to("cpu")) if td is not None else None,
            },
        ),
        (
            "tdt.index",
            f"rows of a LongTensor of B/2={B // 2} rows, (B, T)=({B}, {T}), lengths too",
            {
                "rlstruct": lambda: tdt.index(idx),
                "dict": lambda: ({k: v[idx] for k, v in seq.items()}, full_lengths[idx]),
                "tensordict": (lambda: (td_seq[idx], full_lengths[idx]))
                if td_seq is not None
                else None,
            },
        ),
        (
            "temporal_index",
            f"step t={t_step} of every row, (B, T)=({B}, {T})",
            {
                "rlstruct": lambda: tdt.temporal_index(t_step),
                "dict": lambda: {k: v[:, t_step] for k, v in seq.items()},
                "tensordict": (lambda: td_seq[:, t_step]) if td_seq is not None else None,
            },
        ),
        (
            "to_transitions",
            f"valid steps of ragged rows (sum(lengths)={int(ragged.sum())} of {B * T})",
            {
                "rlstruct": lambda: tdt_ragged.to_transitions(),
                "dict": dict_to_transitions,
                "tensordict": td_to_transitions if td_seq is not None else None,
            },
        ),
    ]
    if device_copy is not None:
        ops.append(
            (
                f"to({device_copy})",
                f"real copy cpu -> {device_copy}, B={B}",
                {
                    "rlstruct": lambda: _synced(lambda: dt.to(device_copy)),
                    "dict": lambda: _synced(
                        lambda: {k: v.to(device_copy) for k, v in flat.items()}
                    ),
                    "tensordict": (lambda: _synced(lambda: td.to(device_copy)))
                    if td is not None
                    else None,
                },
            )
        )
    return ops


def _synced(fn: Callable[[], object]) -> object:
    out = fn()
    torch.cuda.synchronize()
    return out


# ------------------------------------------------------------------------------------- run
def run(quick: bool) -> dict:
    torch.set_num_threads(1)
    reps = 3 if quick else 7
    min_time = 0.002 if quick else 0.05
    device_copy = "cuda" if torch.cuda.is_available() else None
    td_status = (
        f"tensordict {_tensordict_pkg.__version__}" if _tensordict_pkg else "not installed"
    )
    rows: list[Row] = []
    for op, description, fns in build_ops(device_copy):
        present = {name: fn for name, fn in fns.items() if fn is not None}
        check_same(op, {name: fn() for name, fn in present.items()})
        timings = measure(present, reps, min_time)
        rl, dt_, td = timings["rlstruct"], timings["dict"], timings.get("tensordict")
        ratio_dict = rl.median_us / dt_.median_us
        ratio_td = rl.median_us / td.median_us if td is not None else None
        ok = ratio_dict <= MAX_RATIO_VS_DICT and (
            ratio_td is None or ratio_td < MAX_RATIO_VS_TENSORDICT
        )
        rows.append(
            Row(
                op=op,
                description=description,
                rlstruct=rl,
                dict=dt_,
                tensordict=td,
                tensordict_status="ok" if td is not None else "not installed",
                ratio_vs_dict=ratio_dict,
                ratio_vs_tensordict=ratio_td,
                verdict="PASS" if ok else "MISS",
            )
        )
    return {
        "benchmark": "containers",
        "quick": quick,
        "config": {"B": B, "T": T, "n_cat": N_CAT, "n_keys": len(SCHEMA), "reps": reps,
                   "min_time_per_rep_s": min_time},
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "tensordict": td_status,
            "torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "cuda": torch.cuda.is_available(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
        },
        "targets": {"max_ratio_vs_dict": MAX_RATIO_VS_DICT,
                    "max_ratio_vs_tensordict": MAX_RATIO_VS_TENSORDICT},
        "rows": [asdict(r) for r in rows],
    }


def _fmt(t: dict | None) -> str:
    if t is None:
        return "not installed"
    return f"{t['median_us']:8.1f} ({t['min_us']:.1f}-{t['max_us']:.1f})"


def print_table(result: dict) -> None:
    env = result["environment"]
    cfg = result["config"]
    print(
        f"rlstruct containers benchmark: B={cfg['B']} T={cfg['T']} keys={cfg['n_keys']} "
        f"reps={cfg['reps']}; torch {env['torch']}, {env['tensordict']}, "
        f"torch threads={env['torch_threads']}, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}"
    )
    print("µs per op: median (min-max); ratios are of medians. "
          f"Target: rlstruct/dict <= {MAX_RATIO_VS_DICT:g} and rlstruct/TensorDict < 1.")
    head = (f"{'op':<15} {'rlstruct':>24} {'dict':>24} {'TensorDict':>24} "
            f"{'rl/dict':>8} {'rl/TD':>7}  verdict")
    print(head)
    print("-" * len(head))
    for r in result["rows"]:
        rtd = "n/a" if r["ratio_vs_tensordict"] is None else f"{r['ratio_vs_tensordict']:.2f}"
        print(
            f"{r['op']:<15} {_fmt(r['rlstruct']):>24} {_fmt(r['dict']):>24} "
            f"{_fmt(r['tensordict']):>24} {r['ratio_vs_dict']:>8.2f} {rtd:>7}  {r['verdict']}"
        )
    n_pass = sum(r["verdict"] == "PASS" for r in result["rows"])
    print(f"{n_pass}/{len(result['rows'])} ops meet the targets")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few, short reps")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    args = parser.parse_args(argv)
    result = run(args.quick)
    print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

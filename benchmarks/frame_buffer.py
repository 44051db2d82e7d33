"""The image replay buffer at Atari scale: resident memory of 1M transitions and the time to
sample a 32-transition batch, on the CPU.

``FrameReplayBuffer`` (rlstruct/blocks/frame_buffer.py) is filled with ``--transitions``
transitions of 8 frame-stacked streams of ``(4, 84, 84)`` uint8 observations
(random pixels; episodes longer than the run: a reset costs a frame more), in segments of 8 x 128
as DQN adds them. Reported: the process's resident memory before and after, the storage's
bytes, the bytes per transition beside the plain ``ReplayBuffer``'s (two whole stacks), the add
rate (the adds alone, not making the segments), and the median time of ``sample(32)``.

Targets (issue 39): 1M transitions in <= 7.5 GB resident; ``sample(32)`` <= 1 ms.

Usage::

    python benchmarks/frame_buffer.py                    # 1M transitions (~7.2 GB, minutes)
    python benchmarks/frame_buffer.py --quick            # 20k transitions, a few seconds
    python benchmarks/frame_buffer.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import psutil
import torch

from rlstruct import TemporalDictTensor
from rlstruct import keys as K
from rlstruct.blocks.frame_buffer import FrameReplayBuffer

KEYS = (K.OBS_FRAME, K.STORED_ACTION, K.NEXT_FRAME, K.NEXT_REWARD, K.NEXT_TERMINATED,
        K.NEXT_TRUNCATED)
B, T, STACK, SIDE = 8, 128, 4, 84
TARGET_GB_PER_MILLION, TARGET_SAMPLE_MS = 7.5, 1.0


def segments(n_transitions: int, seed: int = 0):
    """Segments ``(B, T)`` of frame-stacked streams: each step shifts in one random frame."""
    g = torch.Generator().manual_seed(seed)
    carry = torch.randint(0, 256, (B, STACK, SIDE, SIDE), generator=g, dtype=torch.uint8)
    done = 0
    while done < n_transitions:
        new = torch.randint(0, 256, (B, T, SIDE, SIDE), generator=g, dtype=torch.uint8)
        seq = torch.cat([carry, new], 1)  # (B, T + 4, 84, 84): the stack, then T new frames
        obs = torch.stack([seq[:, j:j + T] for j in range(STACK)], 2)
        nxt = torch.stack([seq[:, j + 1:j + 1 + T] for j in range(STACK)], 2)
        carry = seq[:, T:].clone()
        yield TemporalDictTensor({
            K.OBS_FRAME: obs, K.NEXT_FRAME: nxt,
            K.NEXT_TERMINATED: torch.zeros(B, T, dtype=torch.bool),
            K.STORED_ACTION: torch.randint(6, (B, T), generator=g),
            K.NEXT_REWARD: torch.zeros(B, T),
            K.NEXT_TRUNCATED: torch.zeros(B, T, dtype=torch.bool),
        }, torch.full((B,), T))
        done += B * T


def measure(n_transitions: int) -> dict:
    """Fills a buffer of ``n_transitions`` and times its sampling."""
    process = psutil.Process()
    rss_before = process.memory_info().rss
    buffer = FrameReplayBuffer(n_transitions, keys=KEYS)
    fill_s = 0.0
    for segment in segments(n_transitions):
        start = time.perf_counter()
        buffer.add(segment)
        fill_s += time.perf_counter() - start
    rss_after = process.memory_info().rss
    times = []
    for _ in range(2000):
        t0 = time.perf_counter()
        buffer.sample(32)
        times.append(time.perf_counter() - t0)
    sample_ms = statistics.median(times) * 1e3
    plain_bytes = 2 * STACK * SIDE * SIDE + 8 + 4 + 2
    resident_gb = (rss_after - rss_before) / 1e9
    per_million = resident_gb * 1e6 / len(buffer)
    return {
        "transitions": len(buffer), "n_frames": buffer.n_frames,
        "storage_gb": buffer.nbytes() / 1e9, "resident_gb": resident_gb,
        "bytes_per_transition": buffer.nbytes() / len(buffer),
        "plain_bytes_per_transition": plain_bytes, "adds_per_s": len(buffer) / fill_s,
        "sample32_median_ms": sample_ms,
        "targets": [
            {"name": "resident GB per 1M transitions", "value": per_million,
             "target": TARGET_GB_PER_MILLION,
             "verdict": "PASS" if per_million <= TARGET_GB_PER_MILLION else "MISS"},
            {"name": "sample(32) ms", "value": sample_ms, "target": TARGET_SAMPLE_MS,
             "verdict": "PASS" if sample_ms <= TARGET_SAMPLE_MS else "MISS"},
        ],
        "load_average": os.getloadavg(), "torch_threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="20,000 transitions")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = measure(20_000 if args.quick else args.transitions)
    print(f"{result['transitions']:,} transitions: {result['resident_gb']:.2f} GB resident "
          f"({result['bytes_per_transition']:,.0f} bytes each; the plain buffer "
          f"{result['plain_bytes_per_transition']:,}), {result['adds_per_s']:,.0f} adds/s, "
          f"sample(32) {result['sample32_median_ms']:.3f} ms; load {result['load_average'][0]:.2f}")
    for target in result["targets"]:
        print(f"  {target['name']}: {target['value']:.3f} (target {target['target']}) "
              f"{target['verdict']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

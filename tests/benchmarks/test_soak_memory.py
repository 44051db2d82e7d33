"""benchmarks/soak_memory.py (issue 38): its slope fit and its sampling of a process tree. The
hour-long soak itself is not run by the suite."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import soak_memory  # a script of benchmarks/, on the path above


def test_the_slope_is_mb_per_hour_of_a_least_squares_line():
    grow = [(t, 300.0 + 0.01 * t) for t in range(0, 600, 10)]  # 0.01 MB/s: 36 MB/hour
    assert math.isclose(soak_memory.slope_per_hour(grow), 36.0, rel_tol=1e-9)
    flat = [(t, 300.0 + (0.5 if t % 20 else -0.5)) for t in range(0, 3600, 10)]
    assert abs(soak_memory.slope_per_hour(flat)) < 0.1
    assert math.isnan(soak_memory.slope_per_hour([(0.0, 1.0)]))


def test_the_sample_names_the_learner_and_its_workers():
    sample = soak_memory.sample_tree(os.getpid())
    assert sample["learner"] > 10  # this process, with torch imported
    assert all(name.startswith("worker ") for name in sample if name != "learner")

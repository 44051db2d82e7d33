"""benchmarks/_common.py's ``median_row``: what atari_peers.py and sac_peers.py report for a
side run ``--reps`` times (alternated with its peer), on hand-built runs (nothing is started)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))  # after tests/
import _common  # benchmarks/ is not a package


def test_each_shared_figure_is_the_median_and_the_runs_are_kept():
    runs = [{"frames_per_s": 603.4, "cores_busy": 1.90, "rows": 77},
            {"frames_per_s": 801.6, "cores_busy": 1.91, "rows": 37},
            {"frames_per_s": 589.2, "cores_busy": 1.89, "rows": 35}]
    row = _common.median_row(runs)
    assert row["frames_per_s"] == 603.4 and row["cores_busy"] == 1.90 and row["rows"] == 37
    assert row["runs"] == runs


def test_an_even_count_averages_the_middle_two_and_a_figure_one_run_lacks_is_left_out():
    row = _common.median_row([{"frames_per_s": 100.0, "of_limit": 0.3}, {"frames_per_s": 120.0}])
    assert row["frames_per_s"] == pytest.approx(110.0) and "of_limit" not in row


def test_no_run_is_an_error_not_an_empty_row():
    with pytest.raises(ValueError, match="at least one run"):
        _common.median_row([])

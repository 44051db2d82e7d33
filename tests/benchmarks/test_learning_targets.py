"""benchmarks/learning.py's verdicts (benchmarks/_learning_targets.py) for the continuous-control
rows and the tuned-layout row, on hand-built run records (no run is started): the Pendulum
ratio targets need every seed solved, the HalfCheetah rows compare return and time with SB3's,
the tuned layout is held to default PPO, and every row knows its task and its peer."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))  # after tests/
import _learning_targets as learning  # benchmarks/ is not a package


def _row(algo: str, impl: str, runs: list[dict]) -> dict:
    row = {"algo": algo, "impl": impl, "runs": runs, "budget_s": 400.0}
    learning.finish_row(row)
    return row


def _run(launch_to_solve: float | None, **extra) -> dict:
    return {"status": "ok", "solved": launch_to_solve is not None,
            "launch_to_solve": launch_to_solve, "time_to_solve": launch_to_solve,
            "frames_to_solve": None if launch_to_solve is None else 7000, **extra}


def _verdicts(rows: dict, seeds: list[int]) -> dict[str, str]:
    return {t["name"]: t["verdict"] for t in learning.targets(rows, seeds)}


def test_rows_know_their_task_and_peer():
    assert learning.row_spec("sac_pendulum")[:2] == ("sac", "pendulum_sac")
    assert learning.row_spec("ppo")[:2] == ("ppo", "cartpole")
    assert learning.peer_key("ppo") == "sb3/PPO"  # the CartPole keys are unchanged
    assert learning.peer_key("trpo_pendulum") == "sb3/TRPO@Pendulum-v1"
    assert learning.peer_key("sac_halfcheetah") == "sb3/SAC@HalfCheetah-v5"
    assert learning.PEER_PACKAGES["TRPO"] == "sb3_contrib"
    assert learning.TASKS["halfcheetah"].target is None


def test_pendulum_ratio_needs_every_seed_solved():
    seeds = [0, 1, 2]
    peer = _row("sac_pendulum", "sb3", [_run(180.0), _run(185.0), _run(190.0)])
    fast = _row("sac_pendulum", "rlstruct", [_run(20.0), _run(25.0), _run(30.0)])
    name = "rlstruct SAC Pendulum-v1 / SB3 SAC"
    rows = {"rlstruct/sac_pendulum": fast, "sb3/SAC@Pendulum-v1": peer}
    assert _verdicts(rows, seeds)[name] == "PASS"
    # two fast seeds give a fine median, but one unsolved seed misses the 3/3 requirement
    rows["rlstruct/sac_pendulum"] = _row("sac_pendulum", "rlstruct",
                                         [_run(20.0), _run(25.0), _run(None)])
    assert _verdicts(rows, seeds)[name].startswith("MISS (2/3")
    assert _verdicts(rows, [0])[name].startswith("n/a (needs >= 3 seeds")  # one seed: no verdict
    rows["rlstruct/sac_pendulum"] = _row("sac_pendulum", "rlstruct",
                                         [_run(100.0), _run(110.0), _run(120.0)])
    assert _verdicts(rows, seeds)[name] == "MISS"  # 110 / 185 > 0.5


def test_halfcheetah_compares_return_and_time_with_sb3():
    def runs(ret, exit_s):
        return [_run(None, train_return=ret, launch_to_exit=exit_s) for _ in range(3)]

    name = "rlstruct SAC HalfCheetah-v5 vs SB3 SAC"
    peer = _row("sac_halfcheetah", "sb3", runs(3000.0, 2000.0))
    for mine, verdict in ((runs(3100.0, 900.0), "PASS"), (runs(2900.0, 900.0), "MISS"),
                          (runs(3100.0, 2100.0), "MISS")):
        rows = {"rlstruct/sac_halfcheetah": _row("sac_halfcheetah", "rlstruct", mine),
                "sb3/SAC@HalfCheetah-v5": peer}
        assert _verdicts(rows, [0, 1, 2])[name] == verdict
    rows = {"rlstruct/sac_halfcheetah": _row("sac_halfcheetah", "rlstruct", runs(1.0, 1.0))}
    assert _verdicts(rows, [0, 1, 2])[name].startswith("n/a")  # no SB3 row: no verdict


def test_tuned_layout_row_is_judged_against_default_ppo():
    name = "rlstruct PPO --layout (freshly tuned) / rlstruct PPO"
    ppo = _row("ppo", "rlstruct", [_run(10.0), _run(11.0), _run(12.0)])
    assert learning.row_spec("ppo_tuned")[3] == {"layout_file": learning.TUNED_LAYOUT}
    assert "ppo_tuned" in learning.NOT_BY_DEFAULT  # it runs the tuner first: named only
    for tuned, verdict in (([_run(9.0), _run(11.0), _run(30.0)], "PASS"),  # median 11 <= 11
                           ([_run(12.0), _run(13.0), _run(9.0)], "MISS"),
                           ([_run(9.0), _run(None), _run(None)], "MISS")):  # median unsolved
        rows = {"rlstruct/ppo": ppo, "rlstruct/ppo_tuned": _row("ppo_tuned", "rlstruct", tuned)}
        assert _verdicts(rows, [0, 1, 2])[name] == verdict
    rows = {"rlstruct/ppo_tuned": _row("ppo_tuned", "rlstruct", [_run(9.0)])}
    assert _verdicts(rows, [0])[name].startswith("n/a")  # no default-layout row to compare

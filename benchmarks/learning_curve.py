"""A long run's learning curve for the docs: the training return against agent steps and against
wall-clock hours, with published results drawn beside it.

Reads ``progress.csv`` of each run folder (a resumed run appends to it, and its clock goes on
from the checkpoint's). A reference ``LABEL=RETURN@STEPS`` draws a marker at that budget and a
dotted line across; a target ``--target RETURN@STEPS`` draws a box the curve should enter.

Run: ``python benchmarks/learning_curve.py RUN_DIR --out docs/pong-ppo.png
--ref "CleanRL ppo_atari=20.36@10000000" --target 18@4000000`` (``--label NAME`` once per
run names the curves; the folders' names otherwise).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any


def read_curve(run_dir: Path) -> tuple[str, list[tuple[float, float, float]]]:
    """``(return column, [(frames, wall seconds, return)])`` of a run's progress.csv."""
    rows = list(csv.DictReader((run_dir / "progress.csv").open()))
    column = next((c for c in rows[0] if c.startswith("train_return")), "train_return")
    points = [(float(r["frames"]), float(r["wall_time"]), float(r[column])) for r in rows
              if r.get(column) not in (None, "", "nan")]
    return column, points


def parse_at(text: str) -> tuple[float, float]:
    """``"18@4000000"`` -> ``(18.0, 4000000.0)``."""
    value, _, steps = text.partition("@")
    return float(value), float(steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders")
    p.add_argument("--out", required=True, type=Path, help="the PNG to write")
    p.add_argument("--ref", action="append", default=[], help="LABEL=RETURN@STEPS (repeatable)")
    p.add_argument("--target", default=None, help="RETURN@STEPS: the target box")
    p.add_argument("--title", default=None)
    p.add_argument("--label", action="append", default=[],
                   help="a legend label per run, in the order of the runs (default: the folder's "
                        "name)")
    args = p.parse_args()
    if args.label and len(args.label) != len(args.runs):
        p.error(f"--label given {len(args.label)} times for {len(args.runs)} runs: one per run")
    fig = draw(args.runs, args.label or [run.name for run in args.runs], args.ref, args.target,
               args.title)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


def draw(runs: list[Path], labels: list[str], refs: list[str], target: str | None,
         title: str | None) -> Any:
    """The figure: each run's curve (under its label) against agent steps and wall-clock hours,
    the references ``LABEL=RETURN@STEPS`` and the target box ``RETURN@STEPS``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_steps, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run, label in zip(runs, labels, strict=True):
        column, points = read_curve(run)
        frames, wall, ret = zip(*points)
        by_steps.plot(frames, ret, lw=1.8, label=f"{label} ({column})")
        by_time.plot([w / 3600 for w in wall], ret, lw=1.8, label=label)
    for i, ref in enumerate(refs):
        label, _, at = ref.partition("=")
        value, steps = parse_at(at)
        colour = f"C{i + 2}"
        by_steps.axhline(value, color=colour, ls=":", lw=1)
        by_steps.plot([steps], [value], marker="*", ms=12, color=colour,
                      label=f"{label}: {value:g} at {steps / 1e6:g}M steps", ls="none")
    if target:
        value, steps = parse_at(target)
        by_steps.axvline(steps, color="grey", ls="--", lw=1)
        by_steps.axhline(value, color="grey", ls="--", lw=1, label=f"target: {value:g} within "
                         f"{steps / 1e6:g}M steps")
    by_steps.set_xlabel("agent steps (x4 emulator frames on Atari)")
    by_time.set_xlabel("wall-clock hours")
    for ax in (by_steps, by_time):
        ax.set_ylabel("training return (last 20 episodes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    main()

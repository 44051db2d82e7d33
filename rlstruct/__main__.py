"""Command-line tools: ``python -m rlstruct <command>``.

Commands:
    plot PATH [PATH ...] [-o OUT]   plot the returns of runs against frames into a PNG. A PATH is
        a run directory or a folder of run directories (``runs/``): every run found is drawn on
        one figure. Default OUT: ``RUN/returns.png`` for one run directory,
        ``FOLDER/compare.png`` for one folder of runs, ``./compare.png`` otherwise.
    sweep ALGO [options] [-- algorithm flags]   run an algorithm over seeds (sessions) and
        config variants (trials) in parallel processes, GPUs in rotation; writes a summary CSV
        and trial graphs (see ``python -m rlstruct sweep --help`` and rlstruct/tools/sweep.py).
    tune [options]   measure candidate batcher layouts within a time budget and write the best
        to a JSON file that ``--layout`` accepts (see ``python -m rlstruct tune --help``).
    evaluate RUN_DIR [--checkpoint best|latest] [--episodes N] [--device D] [--video DIR]
        play the saved policy greedily and print the mean ± std return (see
        :mod:`rlstruct.tools.evaluate`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the process exit code (argparse errors exit with 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sweep"]:
        from rlstruct.tools.sweep import main as sweep_main

        return sweep_main(argv[1:])
    if argv[:1] == ["tune"]:
        from rlstruct.tools.tune import main as tune_main

        return tune_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m rlstruct", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plot = commands.add_parser("plot", help="plot the returns of runs into a PNG")
    plot.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                      help="run directories written by rlstruct.runs.logger.RunLogger, or folders "
                           "of them")
    plot.add_argument("-o", "--out", type=Path, default=None,
                      help="output PNG (default: RUN/returns.png for one run, "
                           "FOLDER/compare.png for one folder of runs, ./compare.png otherwise)")
    # sweep and tune parse their own flags (dispatched above); listed here for --help
    commands.add_parser("sweep", add_help=False,
                        help="run an algorithm over seeds and config variants in parallel")
    commands.add_parser("tune", add_help=False,
                        help="measure batcher layouts and write the best to a --layout file")
    evaluate = commands.add_parser(
        "evaluate", help="play a saved policy greedily and print its mean ± std return")
    evaluate.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run directory")
    evaluate.add_argument("--checkpoint", choices=("latest", "best"), default="latest",
                          help="which checkpoint (default: latest)")
    evaluate.add_argument("--episodes", type=int, default=10,
                          help="episodes to play, one env each (default: 10)")
    evaluate.add_argument("--device", default="cpu", help="where the agent runs (default: cpu)")
    evaluate.add_argument("--seed", type=int, default=None,
                          help="the envs' seed (default: the run's seed + 2000)")
    evaluate.add_argument("--video", type=Path, default=None, metavar="DIR",
                          help="record the first episode into DIR (needs moviepy)")
    args = parser.parse_args(argv)
    if args.command == "evaluate":
        return _evaluate(parser, args)
    return _plot(parser, args)


def _evaluate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from rlstruct.errors import CheckpointError, ConfigError
    from rlstruct.tools.evaluate import describe, evaluate

    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    try:
        returns, state = evaluate(args.run_dir, args.checkpoint, args.episodes, args.device,
                                  args.seed, args.video)
    except (CheckpointError, ConfigError, TimeoutError) as err:
        print(f"python -m rlstruct evaluate: error: {err}", file=sys.stderr)
        return 1
    print(describe(returns, state, args.checkpoint))
    for video in sorted(args.video.glob("*.mp4")) if args.video is not None else []:
        print(f"video: {video}")
    return 0


def _plot(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from rlstruct.runs.plotting import is_run_dir, plot_runs

    missing = [str(p) for p in args.paths if not p.is_dir()]
    if missing:
        parser.error(f"not a directory: {', '.join(missing)}")
    out = args.out
    if out is None and len(args.paths) == 1:
        (path,) = args.paths
        out = path / ("returns.png" if is_run_dir(path) else "compare.png")
    try:
        written = plot_runs(args.paths, out or Path("compare.png"))
    except (FileNotFoundError, ImportError) as err:
        print(f"python -m rlstruct plot: error: {err}", file=sys.stderr)
        return 1
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())

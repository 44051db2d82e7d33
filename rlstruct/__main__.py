"""Command-line tools: ``python -m rlstruct <command>``.

Commands:
    plot PATH [PATH ...] [-o OUT]   plot the returns of runs against frames into a PNG. A PATH is
        a run directory or a folder of run directories (``runs/``): every run found is drawn on
        one figure. Default OUT: ``RUN/returns.png`` for one run directory,
        ``FOLDER/compare.png`` for one folder of runs, ``./compare.png`` otherwise.
    sweep ALGO [options] [-- algorithm flags]   run an algorithm over seeds (sessions) and
        config variants (trials) in parallel processes, GPUs in rotation; writes a summary CSV
        and trial graphs (see ``python -m rlstruct sweep --help`` and rlstruct/sweep.py).
    tune [options]   measure candidate batcher layouts within a time budget and write the best
        to a JSON file that ``--layout`` accepts (see ``python -m rlstruct tune --help``).
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
        from rlstruct.sweep import main as sweep_main

        return sweep_main(argv[1:])
    if argv[:1] == ["tune"]:
        from rlstruct.tune import main as tune_main

        return tune_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m rlstruct", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plot = commands.add_parser("plot", help="plot the returns of runs into a PNG")
    plot.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                      help="run directories written by rlstruct.logger.RunLogger, or folders "
                           "of them")
    plot.add_argument("-o", "--out", type=Path, default=None,
                      help="output PNG (default: RUN/returns.png for one run, "
                           "FOLDER/compare.png for one folder of runs, ./compare.png otherwise)")
    args = parser.parse_args(argv)
    return _plot(parser, args)


def _plot(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from rlstruct.plotting import is_run_dir, plot_runs

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

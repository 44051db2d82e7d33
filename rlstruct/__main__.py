"""Command-line tools: ``python -m rlstruct <command>``.

Commands:
    plot RUN_DIR [RUN_DIR ...] [-o OUT]   plot episode returns against frames into a PNG
        (default OUT: ``RUN_DIR/returns.png`` for one run, ``./compare.png`` for several).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the process exit code (argparse errors exit with 2)."""
    parser = argparse.ArgumentParser(prog="python -m rlstruct", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plot = commands.add_parser("plot", help="plot the returns of one or more runs into a PNG")
    plot.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                      help="run directories written by rlstruct.logger.RunLogger")
    plot.add_argument("-o", "--out", type=Path, default=None,
                      help="output PNG (default: RUN_DIR/returns.png for one run, "
                           "./compare.png for several)")

    args = parser.parse_args(argv)
    if args.command == "plot":
        return _plot(parser, args)
    parser.error(f"unknown command {args.command!r}")  # unreachable: subparsers check it
    return 2


def _plot(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from rlstruct.logger import plot_runs

    missing = [str(d) for d in args.run_dirs if not Path(d).is_dir()]
    if missing:
        parser.error(f"not a directory: {', '.join(missing)}")
    out = args.out
    if out is None:
        out = args.run_dirs[0] / "returns.png" if len(args.run_dirs) == 1 else Path("compare.png")
    try:
        written = plot_runs(args.run_dirs, out)
    except (FileNotFoundError, ImportError) as err:
        print(f"python -m rlstruct plot: error: {err}", file=sys.stderr)
        return 1
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())

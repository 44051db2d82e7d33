"""The command line: ``rlstruct COMMAND`` (the console script) or ``python -m rlstruct COMMAND``.

Commands (``rlstruct COMMAND --help`` shows each one's flags):
    train ALGO [flags]   train an algorithm (``rlstruct train --help`` lists them):
        ``rlstruct train ppo --seed 1`` is ``python -m rlstruct.algos.ppo --seed 1``, the same
        ``Config`` parsed by tyro and the same ``main``.
    evaluate RUN_DIR [--checkpoint best|latest] [--episodes N] [--device D] [--video DIR]
        play the saved policy greedily and print the mean ± std return
        (:mod:`rlstruct.tools.evaluate`).
    plot PATH [PATH ...] [-o OUT] [--x wall_time]   plot the returns of runs against frames (or
        the wall time) into a PNG. A PATH is a run directory or a folder holding run
        directories (``runs/``, a sweep's folder): every run found is drawn on one figure.
        Default OUT: ``RUN/returns.png`` for one run directory, ``FOLDER/compare.png`` for one
        folder of runs, ``./compare.png`` otherwise.
    export RUN_DIR --format onnx|torchscript [--out FILE] [--checkpoint latest|best]   write
        the saved greedy policy to one file that runs without rlstruct (onnxruntime, or
        ``torch.jit.load``); default FILE: ``RUN_DIR/policy.onnx`` or ``RUN_DIR/policy.pt``
        (:mod:`rlstruct.tools.export`).
    sweep ALGO [options] [-- algorithm flags]   run an algorithm over seeds (sessions) and
        config variants (trials) in parallel processes, GPUs in rotation; writes a summary CSV
        and trial graphs (:mod:`rlstruct.tools.sweep`).
    tune --algo MODULE:FUNCTION [options]   measure candidate batcher layouts within a time
        budget and write the best to a JSON file that ``--layout`` accepts
        (:mod:`rlstruct.tools.tune`).

One library builds the whole command line: tyro. Each command is a dataclass whose fields are
its flags (an algorithm's ``Config``, :class:`EvaluateCommand`, :class:`PlotCommand`,
:class:`ExportCommand`, :class:`~rlstruct.tools.sweep.SweepCommand`,
:class:`~rlstruct.tools.tune.cli.TuneCommand`), and
:func:`command_tree` is tyro's subcommand tree over them. ``rlstruct --help`` (and a word no
command takes) is answered from :func:`overview_tree`: the same subcommands and help lines,
without the flags of the commands that import the algorithms (``train``, ``sweep``, ``tune``),
so that it imports no algorithm and parses no algorithm's ``Config``; ``rlstruct COMMAND
--help`` shows the flags. A command line
is parsed by the command its first word names, under the prog ``rlstruct <command>``, so that
its messages name the command and only its modules are imported (``rlstruct train ppo`` imports
PPO, not the seven others). Usage errors exit with code 2 and one message.
"""

from __future__ import annotations

import dataclasses
import importlib
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, Union

import tyro

from rlstruct.parallel import startup

__all__ = ["ALGOS", "COMMANDS", "EvaluateCommand", "PlotCommand", "ExportCommand", "command_tree",
           "overview_tree", "main", "train"]

PROG = "rlstruct"

#: The algorithms of ``rlstruct train``: ``rlstruct.algos.<name>``, each with a ``Config`` and
#: a ``main(cfg)``.
ALGOS: tuple[str, ...] = ("reinforce", "a2c", "ppo", "dqn", "impala", "appo", "trpo", "sac")

#: The commands and what ``rlstruct --help`` says of each.
COMMANDS: dict[str, str] = {
    "train": "train an algorithm: rlstruct train ALGO [flags] (python -m rlstruct.algos.ALGO)",
    "evaluate": "play a saved policy greedily and print its mean ± std return",
    "plot": "plot the returns of runs against frames or wall time into a PNG",
    "export": "write a saved policy to an ONNX or TorchScript file that runs without rlstruct",
    "sweep": "run an algorithm over seeds and config variants in parallel processes",
    "tune": "measure batcher layouts and write the best to a --layout file",
}


@dataclass
class EvaluateCommand:
    """Play a run's saved policy greedily and print the mean ± std return of its episodes.

    Example: rlstruct evaluate runs/ppo_CartPole-v1_20261125-101500 --checkpoint best
    """

    run_dir: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """a run directory"""
    checkpoint: Literal["latest", "best"] = "latest"
    """which checkpoint"""
    episodes: int = 10
    """episodes to play, one env each"""
    device: str = "cpu"
    """where the agent runs"""
    seed: int | None = None
    """the envs' seed (None: the run's seed + 2000)"""
    video: Annotated[Path | None, tyro.conf.arg(metavar="{None}|DIR")] = None
    """record the first episode into DIR (needs moviepy); a run trained with --wandb also gets
    it in its wandb run"""


@dataclass
class PlotCommand:
    """Plot the returns of runs against frames (or the wall time) into a PNG: every run found in
    the PATHs on one figure, each labelled with its seed and what differs between them.

    Example: rlstruct plot runs/ (writes runs/compare.png); rlstruct plot SWEEP_OUT --x wall_time
    """

    paths: Annotated[tuple[Path, ...], tyro.conf.Positional, tyro.conf.arg(metavar="PATH")]
    """run directories, or folders holding them (runs/, a sweep's --out folder)"""
    out: Annotated[Path | None, tyro.conf.arg(aliases=("-o",))] = None
    """output PNG (None: RUN/returns.png for one run, FOLDER/compare.png for one folder of
    runs, ./compare.png otherwise)"""
    x: Literal["frames", "wall_time"] = "frames"
    """the x axis: frames, or wall_time (seconds since the run started)"""


@dataclass
class ExportCommand:
    """Write a run's saved greedy policy to one file that runs without rlstruct: ONNX (with
    onnxruntime; the export extra) or TorchScript (with torch.jit.load). Observation in; the
    greedy action and the head's logits (categorical), mean (Gaussian) or Q values (DQN) out;
    a recurrent model also takes its state (zeros at an episode's start) and gives the next.

    Example: rlstruct export runs/ppo_CartPole-v1_20261125-101500 --format onnx
    """

    run_dir: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """a run directory"""
    format: Literal["onnx", "torchscript"]
    """the file's format"""
    out: Annotated[Path | None, tyro.conf.arg(metavar="{None}|FILE")] = None
    """the file to write (None: RUN_DIR/policy.onnx, or RUN_DIR/policy.pt for torchscript)"""
    checkpoint: Literal["latest", "best"] = "latest"
    """which checkpoint"""


def _usage_error(prog: str, message: str) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _train_tree() -> Any:
    """The union of the algorithms' Configs, one subcommand each (imports every algorithm)."""
    configs = []
    for name in ALGOS:
        config = importlib.import_module(f"rlstruct.algos.{name}").Config
        summary = " ".join((config.__doc__ or name).strip().split("\n\n")[0].split())
        configs.append(Annotated[config, tyro.conf.subcommand(name, description=summary)])
    return Union[tuple(configs)]  # noqa: UP007 (a Union built at run time)


def command_tree() -> Any:
    """The whole command line as one tyro type: a subcommand per command, ``train`` holding one
    per algorithm. Building it imports every algorithm (for their Configs); :func:`main` builds
    it for no command line (:func:`overview_tree` answers ``rlstruct --help``); it is the
    whole command line in one type, for tools and tests.

    Returns:
        A ``Union`` of ``Annotated`` dataclasses for :func:`tyro.cli`.
    """
    from rlstruct.tools.sweep import SweepCommand
    from rlstruct.tools.tune.cli import TuneCommand

    types = {"train": _train_tree(), "evaluate": EvaluateCommand, "plot": PlotCommand,
             "export": ExportCommand, "sweep": SweepCommand, "tune": TuneCommand}
    return Union[tuple(  # noqa: UP007 (a Union built at run time)
        Annotated[types[name], tyro.conf.subcommand(name, description=help_text)]
        for name, help_text in COMMANDS.items())]


def overview_tree() -> Any:
    """The command line's subcommands with their help lines, for ``rlstruct --help``: the
    evaluate, plot and export commands with their flags, and ``train``, ``sweep`` and ``tune`` as
    placeholders without flags (their flags are the algorithms' and need them imported: see
    ``rlstruct COMMAND --help``). Imports no algorithm.

    Returns:
        A ``Union`` of ``Annotated`` dataclasses for :func:`tyro.cli`.
    """
    types = {"evaluate": EvaluateCommand, "plot": PlotCommand, "export": ExportCommand}
    for name in ("train", "sweep", "tune"):
        placeholder = dataclasses.make_dataclass(f"{name.title()}Overview", [])
        placeholder.__doc__ = f"{COMMANDS[name]} (rlstruct {name} --help: its flags)"
        types[name] = placeholder
    return Union[tuple(  # noqa: UP007 (a Union built at run time)
        Annotated[types[name], tyro.conf.subcommand(name, description=help_text)]
        for name, help_text in COMMANDS.items())]


def train(argv: Sequence[str]) -> int:
    """``rlstruct train ALGO [flags]``: parses the flags with the algorithm's ``Config``, as
    ``python -m rlstruct.algos.ALGO`` does, and runs its ``main``.

    Args:
        argv: the words after ``train``: the algorithm's name, then its flags.

    Returns:
        0 once the run has ended (a failed run raises its error).

    Raises:
        SystemExit: ``--help`` (code 0); a bad flag, a config problem or an unknown algorithm
            (code 2, after one message).
    """
    argv = list(argv)
    if not argv or argv[0] not in ALGOS:
        # `rlstruct train --help` lists the algorithms; anything else is a usage error
        tyro.cli(_train_tree(), args=argv, prog=f"{PROG} train",
                 description=COMMANDS["train"])
        _usage_error(f"{PROG} train", f"name an algorithm: one of {', '.join(ALGOS)}")
    module = importlib.import_module(f"rlstruct.algos.{argv[0]}")
    from rlstruct.runs.resolve import run_cli

    run_cli(module.main, module.Config, args=argv[1:], prog=f"{PROG} train {argv[0]}")
    return 0


def _evaluate(argv: Sequence[str]) -> int:
    args = tyro.cli(EvaluateCommand, args=list(argv), prog=f"{PROG} evaluate")
    from rlstruct.errors import CheckpointError, ConfigError
    from rlstruct.tools.evaluate import describe, evaluate

    if args.episodes < 1:
        _usage_error(f"{PROG} evaluate", f"--episodes must be >= 1, got {args.episodes}")
    from rlstruct.devices import resolve_device

    try:  # a device this machine lacks is a usage error, named before anything loads
        resolve_device(args.device)
    except ConfigError as err:
        _usage_error(f"{PROG} evaluate", f"--device: {err}")
    try:
        returns, state = evaluate(args.run_dir, args.checkpoint, args.episodes, args.device,
                                  args.seed, args.video)
    except (CheckpointError, ConfigError, TimeoutError) as err:
        print(f"{PROG} evaluate: error: {err}", file=sys.stderr)
        return 1
    print(describe(returns, state, args.checkpoint))
    videos = sorted(args.video.glob("*.mp4")) if args.video is not None else []
    for video in videos:
        print(f"video: {video}")
    if videos:  # a run tracked with --wandb gets its video (rlstruct.runs.tracking)
        from rlstruct.runs.tracking import log_videos

        if log_videos(args.run_dir, videos, int(state.get("frames", 0))):
            print(f"video logged to the run's wandb run ({args.run_dir / 'wandb.json'})")
    return 0


def _plot(argv: Sequence[str]) -> int:
    args = tyro.cli(PlotCommand, args=list(argv), prog=f"{PROG} plot")
    from rlstruct.errors import RunFileError
    from rlstruct.runs.plotting import is_run_dir, plot_runs

    if not args.paths:
        _usage_error(f"{PROG} plot", "give at least one PATH (a run directory or a folder of them)")
    missing = [str(p) for p in args.paths if not p.is_dir()]
    if missing:
        _usage_error(f"{PROG} plot", f"not a directory: {', '.join(missing)}")
    out = args.out
    if out is None and len(args.paths) == 1:
        (path,) = args.paths
        out = path / ("returns.png" if is_run_dir(path) else "compare.png")
    try:
        written = plot_runs(list(args.paths), out or Path("compare.png"), x=args.x)
    except (FileNotFoundError, ImportError, RunFileError) as err:
        print(f"{PROG} plot: error: {err}", file=sys.stderr)
        return 1
    print(written)
    return 0


def _export(argv: Sequence[str]) -> int:
    args = tyro.cli(ExportCommand, args=list(argv), prog=f"{PROG} export")
    from rlstruct.errors import CheckpointError, ConfigError
    from rlstruct.tools.export import describe, export_policy, read_signature

    try:
        path = export_policy(args.run_dir, args.format, args.out, args.checkpoint)
    except (CheckpointError, ConfigError) as err:
        print(f"{PROG} export: error: {err}", file=sys.stderr)
        return 1
    print(describe(path, read_signature(path)))
    return 0


def _sweep(argv: Sequence[str]) -> int:
    from rlstruct.tools.sweep import main as sweep_main

    return sweep_main(argv)


def _tune(argv: Sequence[str]) -> int:
    from rlstruct.tools.tune.cli import main as tune_main

    return tune_main(argv)


_RUN: dict[str, Callable[[Sequence[str]], int]] = {
    "train": train, "evaluate": _evaluate, "plot": _plot, "export": _export, "sweep": _sweep,
    "tune": _tune}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command: the console script ``rlstruct`` and ``python -m rlstruct``.

    Args:
        argv: the command line after the program's name (default: ``sys.argv[1:]``).

    Returns:
        The command's exit code (0: success).

    Raises:
        SystemExit: ``--help`` (code 0), or a usage error (code 2, after one message on
            stderr).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with startup.catching():  # SIGTERM, Ctrl-C: one line, no traceback (train: run_cli's)
            if argv and argv[0] in _RUN:
                return _RUN[argv[0]](argv[1:])
            # no command, --help, or a word no command takes: tyro's tree shows the help or
            # the error
            tyro.cli(overview_tree(), args=argv, prog=PROG,
                     description="rlstruct: train, evaluate, plot, export, sweep and tune from "
                     "the shell")
            _usage_error(PROG, f"name a command: one of {', '.join(COMMANDS)}")
    except KeyboardInterrupt as stop:
        code = startup.EXIT_CODES.get(getattr(stop, "signum", signal.SIGINT), 130)
        what = str(stop).removeprefix("signal ") or "SIGINT"
        command = f"{PROG} {argv[0]}" if argv and argv[0] in _RUN else PROG
        print(f"{command}: stopped by {what} (exit code {code})", file=sys.stderr, flush=True)
        return code


if __name__ == "__main__":
    sys.exit(main())

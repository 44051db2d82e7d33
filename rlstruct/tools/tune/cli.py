"""``python -m rlstruct tune``: tune an algorithm's layout from the shell.

``--algo MODULE:FUNCTION`` names the algorithm's side: the module is imported (it is the user's
code; the library itself imports no algorithm) and ``FUNCTION(seed=..., [env_id=...],
[hidden=...])`` returns the :class:`~rlstruct.tools.tune.measure.AlgoSetup` to measure. For the
algorithms of ``rlstruct/algos/``: ``--algo rlstruct.algos.tuning:ppo`` (also ``a2c``, ``impala``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlstruct.errors import ConfigError
from rlstruct.tools.tune.layout_file import write_layout
from rlstruct.tools.tune.measure import AlgoSetup, tune_algo
from rlstruct.tools.tune.searches import OBJECTIVES

__all__ = ["load_setup", "main"]


def load_setup(spec: str, **overrides: Any) -> AlgoSetup:
    """The :class:`AlgoSetup` of ``spec`` (``"module:function"``): imports the module and calls
    ``function(**overrides)``.

    Raises:
        ConfigError: ``spec`` is not ``module:function``, the module does not import, the
            function is missing, or it returns something else than an AlgoSetup.
    """
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise ConfigError(f"--algo takes MODULE:FUNCTION (a function returning an AlgoSetup, "
                          f"e.g. rlstruct.algos.tuning:ppo), got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"--algo {spec}: cannot import {module_name!r} ({err}); run from the "
                          "folder that holds it or put it on PYTHONPATH") from err
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"--algo {spec}: {module_name} has no function {function_name!r}")
    try:
        setup = function(**overrides)
    except TypeError as err:  # a function that does not take the overrides
        raise ConfigError(f"--algo {spec}: {function_name}({', '.join(overrides)}=...) "
                          f"failed: {err}") from err
    if not isinstance(setup, AlgoSetup):
        raise ConfigError(f"--algo {spec}: {function_name}() returned {type(setup).__name__}, "
                          "expected an AlgoSetup")
    return setup


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") \
            from err
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlstruct tune``: tune an algorithm's layout, print the table, write JSON.

    Returns:
        The exit code (0; 1 when no candidate could be measured).
    """
    parser = argparse.ArgumentParser(
        prog="python -m rlstruct tune",
        description="Measure candidate batcher layouts of an algorithm within a time budget, "
                    "print a table and write the best one to a JSON layout file.")
    parser.add_argument("--algo", required=True, metavar="MODULE:FUNCTION",
                        help="the algorithm's side: FUNCTION(**overrides) of MODULE returns the "
                             "AlgoSetup to measure (e.g. rlstruct.algos.tuning:ppo)")
    parser.add_argument("--env-id", default=None, help="gymnasium id (default: the algorithm's)")
    parser.add_argument("--hidden", type=int, default=None, help="model width (default: the "
                        "algorithm's)")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="seconds the measurements may take (default 60)")
    parser.add_argument("--objective", default="steps_per_s", choices=OBJECTIVES,
                        help="maximise steps per second or steps per CPU-second")
    parser.add_argument("--no-learner", action="store_true",
                        help="measure collection alone (or with --learn-s), not under the "
                             "algorithm's own learn step")
    parser.add_argument("--learn-s", type=float, default=0.0,
                        help="a fake learner of this many seconds per batch instead of the "
                             "algorithm's (0: none)")
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--keep-batch", action="store_true",
                       help="keep the algorithm's batch (P x n_envs x T steps) while the "
                            "layout varies: T follows from P and n_envs")
    batch.add_argument("--batch-size", type=int, default=None,
                       help="keep the batch at this many steps while the layout varies")
    parser.add_argument("--rounds", type=int, default=2,
                        help="interleaved rounds of the finals (default 2)")
    parser.add_argument("--processes", type=_ints, default=None,
                        help="worker counts, e.g. 1,2,4 (1: SerialBatcher; default 1, 2, 4, "
                             "... up to the cores)")
    parser.add_argument("--n-envs", type=_ints, default=[8, 16, 32, 64],
                        help="envs per process (default 8,16,32,64)")
    parser.add_argument("--n-timesteps", type=_ints, default=[16, 32, 64],
                        help="values of T (default 16,32,64)")
    parser.add_argument("--pipeline", type=_ints, default=None,
                        help="pipeline depths (default 1,2 for algorithms that support it)")
    parser.add_argument("--devices", default=None,
                        help="comma-separated GPU devices for a SerialBatcher (default cuda:0 "
                             "when there is one; 'none' for none)")
    parser.add_argument("--probe-s", type=float, default=None,
                        help="seconds of a first measurement (default: from the budget)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--out", type=Path, default=Path("tune.json"),
                        help="the layout file to write (default tune.json)")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {"seed": args.seed}
    if args.env_id is not None:
        overrides["env_id"] = args.env_id
    if args.hidden is not None:
        overrides["hidden"] = args.hidden
    devices = None
    if args.devices is not None:
        devices = [] if args.devices == "none" else [d for d in args.devices.split(",") if d]
    options: dict[str, Any] = dict(
        processes=args.processes, n_envs_options=args.n_envs,
        n_timesteps_options=args.n_timesteps, devices=devices, objective=args.objective,
        learn_s=args.learn_s, probe_s=args.probe_s, n_rounds=args.rounds,
        batch_size=args.batch_size)
    if args.pipeline is not None:
        options["pipelines"] = args.pipeline
    try:
        setup = load_setup(args.algo, **overrides)
        result = tune_algo(setup, budget_s=args.budget, keep_batch=args.keep_batch,
                           use_learner=not args.no_learner, **options)
    except ConfigError as err:
        print(f"python -m rlstruct tune: error: {err}", file=sys.stderr)
        return 2
    if result.stats[result.best].error is not None:
        print("python -m rlstruct tune: every measured layout failed", file=sys.stderr)
        return 1
    learner = ("fake" if args.learn_s else "none") if args.no_learner or args.learn_s or \
        setup.learn is None else "algorithm"
    written = write_layout(args.out, result, algo=setup.name or args.algo,
                           env_id=setup.env_id or args.env_id, learner=learner,
                           learn_s=args.learn_s)
    print(f"best: {result.best.label} -> {written} (use it with --layout {written})")
    return 0

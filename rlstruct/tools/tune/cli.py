"""``rlstruct tune``: tune an algorithm's layout from the shell (:class:`TuneCommand`'s flags).

``--algo MODULE:FUNCTION`` names the algorithm's side: the module is imported (it is the user's
code; the library itself imports no algorithm) and ``FUNCTION(seed=..., [env_id=...],
[hidden=...], [preset=...], [env_backend=...])`` returns the
:class:`~rlstruct.tools.tune.measure.AlgoSetup` to measure. For the algorithms of
``rlstruct/algos/``: ``--algo rlstruct.algos.tuning:ppo`` (also ``a2c``, ``impala``).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from rlstruct.errors import ConfigError
from rlstruct.runs.layout_file import write_layout
from rlstruct.tools.tune.measure import AlgoSetup, tune_algo
from rlstruct.tools.tune.searches import tuned_layout

__all__ = ["TuneCommand", "load_setup", "main", "run", "setup_overrides"]

PROG = "rlstruct tune"


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


def _ints(args: list[str]) -> tuple[int, ...] | None:
    """``"1,2,4"`` as ``(1, 2, 4)``, ``"None"`` as None; a ValueError (a usage error of
    tyro's) otherwise."""
    (text,) = args
    if text == "None":
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"expected integers >= 1, got {text!r}")
    return values


def _ints_flag(metavar: str) -> tyro.constructors.PrimitiveConstructorSpec:
    return tyro.constructors.PrimitiveConstructorSpec(
        nargs=1, metavar=metavar, instance_from_str=_ints,
        is_instance=lambda v: v is None or isinstance(v, tuple),
        str_from_instance=lambda v: ["None" if v is None else ",".join(map(str, v))])


#: A flag of comma-separated integers >= 1 (``--n-envs 8,16``).
Ints = Annotated[tuple[int, ...], _ints_flag("N,N,...")]
#: The same, or None (``--processes None``: the default choice).
IntsOrNone = Annotated[tuple[int, ...] | None, _ints_flag("{None}|N,N,...")]


@dataclass
class TuneCommand:
    """Measure candidate batcher layouts of an algorithm within a time budget, print a table and
    write the best one to a JSON layout file, which rlstruct train ALGO --layout FILE takes.
    The algorithm's batch (P x n_envs x T steps) is kept unless --vary-batch.

    Example: rlstruct tune --algo rlstruct.algos.tuning:ppo --budget 60 -o tune.json
    """

    algo: Annotated[str, tyro.conf.arg(metavar="MODULE:FUNCTION")]
    """the algorithm's side: FUNCTION of MODULE, called with the config overrides, returns the
    AlgoSetup to measure (e.g. rlstruct.algos.tuning:ppo, also :a2c and :impala)"""
    env_id: str | None = None
    """env id (None: the algorithm's, or the preset's)"""
    preset: str | None = None
    """one of the algorithm's presets (e.g. atari: the Nature CNN on Pong's frames), its
    settings under the layout measured (None: the algorithm's defaults)"""
    env_backend: Literal["gymnasium", "torch", "atari", "envpool", "vector"] | None = None
    """the training envs' backend, as a run's --env-backend (gymnasium, torch, atari, envpool,
    vector; None: the algorithm's or the preset's): tune once with each to compare them"""
    hidden: int | None = None
    """model width (None: the algorithm's)"""
    budget: float = 60.0
    """seconds the measurements may take"""
    objective: Literal["steps_per_s", "steps_per_cpu_s"] = "steps_per_s"
    """maximise steps per second or steps per CPU-second"""
    learner: bool = True
    """measure under the algorithm's own learn step (--no-learner: collection alone, or with
    --learn-s)"""
    learn_s: float = 0.0
    """a fake learner of this many seconds per batch instead of the algorithm's (0: none)"""
    vary_batch: bool = False
    """let the batch (P x n_envs x T steps) vary with the layout, every T of --n-timesteps: this
    changes what an on-policy algorithm learns from, not only the speed (default: the
    algorithm's batch is kept, T following from P and n_envs)"""
    keep_batch: bool = False
    """keep the algorithm's batch: the default, accepted for older command lines (not with
    --vary-batch)"""
    batch_size: int | None = None
    """keep the batch at this many steps instead of the algorithm's (not with --vary-batch)"""
    rounds: int = 2
    """interleaved rounds of the finals"""
    processes: IntsOrNone = None
    """worker counts, e.g. 1,2,4 (1: SerialBatcher; None: 1, 2, 4, ... up to the cores)"""
    n_envs: Ints = (8, 16, 32, 64)
    """envs per process"""
    n_timesteps: Ints = (16, 32, 64)
    """values of T"""
    pipeline: IntsOrNone = None
    """pipeline depths (None: 1,2 for algorithms that support it)"""
    n_threads: IntsOrNone = None
    """learner torch threads to try, e.g. 1,2 (None: 1, 2, 4, ... up to the usable cores when
    the algorithm's learner is measured, 1 otherwise); the pick's is written to the file and
    --layout sets the run's --n-threads from it"""
    devices: str | None = None
    """comma-separated GPU devices for a SerialBatcher (None: cuda:0 when there is one; 'none'
    for none)"""
    probe_s: float | None = None
    """seconds of a first measurement (None: from the budget)"""
    seed: int = 0
    """the seed given to the algorithm's setup"""
    out: Annotated[Path, tyro.conf.arg(aliases=("-o",))] = Path("tune.json")
    """the layout file to write"""


def setup_overrides(args: TuneCommand) -> dict[str, Any]:
    """The keywords the command gives the ``--algo`` function: ``seed``, and ``env_id``,
    ``hidden``, ``preset`` and ``env_backend`` where given."""
    given = {"env_id": args.env_id, "hidden": args.hidden, "preset": args.preset,
             "env_backend": args.env_backend}
    return {"seed": args.seed, **{k: v for k, v in given.items() if v is not None}}


def main(argv: Sequence[str] | None = None) -> int:
    """``rlstruct tune``: tune an algorithm's layout, print the table, write JSON.

    Args:
        argv: the flags after ``tune`` (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0; 1 when no candidate could be measured; 2 on a usage error (tyro's
        exit for a bad flag, or a bad ``--algo`` and options).
    """
    args = tyro.cli(TuneCommand, args=sys.argv[1:] if argv is None else list(argv), prog=PROG)
    return run(args)


def run(args: TuneCommand) -> int:
    """Runs a parsed ``rlstruct tune`` command line (see :func:`main`).

    Args:
        args: the parsed flags.

    Returns:
        The exit code (0, 1 or 2, as :func:`main`).
    """
    if args.vary_batch and (args.keep_batch or args.batch_size is not None):
        flag = "--keep-batch" if args.keep_batch else "--batch-size"
        print(f"{PROG}: error: --vary-batch and {flag} exclude each other", file=sys.stderr)
        return 2
    overrides = setup_overrides(args)
    devices = None
    if args.devices is not None:
        devices = [] if args.devices == "none" else [d for d in args.devices.split(",") if d]
    options: dict[str, Any] = dict(
        processes=None if args.processes is None else list(args.processes),
        n_envs_options=list(args.n_envs), n_timesteps_options=list(args.n_timesteps),
        devices=devices, objective=args.objective, learn_s=args.learn_s, probe_s=args.probe_s,
        n_rounds=args.rounds, batch_size=args.batch_size)
    if args.pipeline is not None:
        options["pipelines"] = list(args.pipeline)
    if args.n_threads is not None:
        options["n_threads_options"] = list(args.n_threads)
    try:
        setup = load_setup(args.algo, **overrides)
        result = tune_algo(setup, budget_s=args.budget, keep_batch=not args.vary_batch,
                           use_learner=args.learner, **options)
    except ConfigError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    if result.stats[result.best].error is not None:
        print(f"{PROG}: every measured layout failed", file=sys.stderr)
        return 1
    learner = ("fake" if args.learn_s else "none") if not args.learner or args.learn_s or \
        setup.learn is None else "algorithm"
    pick = tuned_layout(result, algo=setup.name or args.algo, env_id=setup.env_id or args.env_id,
                        learner=learner, learn_s=args.learn_s)
    # a backend other than gymnasium's goes into the file: --layout FILE then trains on it
    backend = "" if setup.env_backend == "gymnasium" else setup.env_backend
    written = write_layout(args.out, dataclasses.replace(pick, env_backend=backend))
    print(f"best: {result.best.label} -> {written} (use it with --layout {written})")
    return 0

"""Experiment tracking with Weights & Biases: :class:`WandbTracker` (``--wandb``).

With ``--wandb`` a run mirrors its folder into a wandb run (the ``wandb`` extra): every
``progress.csv`` row (``frames`` is the step metric of every chart: a resumed run that goes back
to its checkpoint's frames still draws on the same axis), ``config.json``'s content as the wandb
config, and at the end the plots (``returns.png``, ``resources.png``) as images.
``rlstruct evaluate RUN_DIR --video DIR`` adds the video it records to the same wandb run
(:func:`log_videos`). The wandb run's id is kept in the run folder's ``wandb.json``, so that a
resumed run (``--resume``) continues the same wandb run.

Tracking never makes a run fail: a wandb error (at start, on a row, at the end) becomes one
warning and tracking stops for the rest of the run, which goes on. A missing wandb with
``--wandb`` is refused before the run starts (:func:`tracking_problems`, in
:func:`~rlstruct.runs.resolve.resolve`). ``WANDB_MODE=offline`` writes the wandb run under
``WANDB_DIR`` (default ``./wandb``) without the network, for ``wandb sync`` later.

Example:
    >>> from rlstruct.algos.ppo import Config
    >>> run_tags("ppo", Config(env_id="Acrobot-v1"))
    ('ppo', 'Acrobot-v1')
"""

from __future__ import annotations

import importlib
import json
import math
import secrets
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlstruct.errors import install_hint

__all__ = ["TrackingOptions", "WandbTracker", "tracking_options", "tracking_problems",
           "run_tags", "log_videos", "WANDB_FILE", "FINISH_TIMEOUT_S"]

#: The run folder's record of its wandb run (id, project, group), for ``--resume`` and videos.
WANDB_FILE = "wandb.json"
#: The longest :meth:`WandbTracker.finish` waits for wandb to finish its run (its uploads).
FINISH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TrackingOptions:
    """Where a run's wandb run goes.

    Attributes:
        project: the wandb project (``--wandb-project``).
        group: the wandb group (``--wandb-group``; None: none).
        tags: the run's tags (:func:`run_tags`).
    """

    project: str
    group: str | None
    tags: tuple[str, ...]


def run_tags(algo: str, cfg: Any) -> tuple[str, ...]:
    """A run's wandb tags: the algorithm, the env id, and the preset if any."""
    preset = getattr(cfg, "preset", None)
    return (algo, cfg.env_id, *((preset,) if preset else ()))


def tracking_options(algo: str, cfg: Any) -> TrackingOptions | None:
    """The :class:`TrackingOptions` of a config (a :class:`~rlstruct.runs.config.RunConfig`),
    or None when its ``wandb`` flag is off."""
    if not getattr(cfg, "wandb", False):
        return None
    return TrackingOptions(cfg.wandb_project, cfg.wandb_group, run_tags(algo, cfg))


def tracking_problems(cfg: Any) -> list[str]:
    """What keeps the config's tracking from running (empty: nothing): ``--wandb`` without
    wandb installed, or an empty project name. (A wandb whose import fails otherwise is the
    run's warning, as any other wandb error.)"""
    if not getattr(cfg, "wandb", False):
        return []
    if not cfg.wandb_project:
        return ["wandb_project must be a wandb project name, got an empty one"]
    try:
        importlib.import_module("wandb")
    except ImportError as err:
        return [f"--wandb needs wandb, which cannot be imported ({err}): "
                f"{install_hint('wandb')}"]
    except Exception:  # noqa: BLE001 - an install that breaks on import: the run's warning
        pass
    return []


class WandbTracker:
    """Mirrors one run folder into a wandb run; see the module notes.

    Every wandb call is guarded: the first one that raises is one warning
    (``wandb <what> failed: ...; the run goes on without wandb``) and turns tracking off
    (:attr:`active` False); the later calls do nothing. The run is still finished by
    :meth:`finish`.

    Args:
        options: the project, group and tags.
        folder: the run folder (its name names the wandb run; ``wandb.json`` is written there).
        config: what the wandb config gets: ``config.json``'s content.
    """

    def __init__(self, options: TrackingOptions, folder: Path, config: Mapping[str, Any]) -> None:
        self.folder = Path(folder)
        self._run: Any = None
        self._active = False
        self._wandb: Any = None
        self._guard("init", lambda: self._start(options, dict(config)))

    @property
    def active(self) -> bool:
        """Whether rows still go to wandb (False after an error, or after :meth:`finish`)."""
        return self._active

    def log(self, row: Mapping[str, Any]) -> None:
        """Logs one progress row (``frames`` included; nan values are left out)."""
        if self._active:
            values = {k: v for k, v in row.items()
                      if isinstance(v, (int, float)) and not math.isnan(v)}
            self._guard("log", lambda: self._run.log(values))

    def log_images(self, paths: Sequence[Path], frames: int) -> None:
        """Logs the image files that exist among ``paths`` (the plots), each under its stem
        (``returns``), at ``frames``."""
        found = [Path(p) for p in paths if Path(p).is_file()]
        if self._active and found:
            self._guard("log of the plots", lambda: self._run.log(
                {"frames": frames, **{p.stem: self._wandb.Image(str(p)) for p in found}}))

    def log_videos(self, paths: Sequence[Path], frames: int) -> None:
        """Logs the videos ``paths`` (``.mp4`` files) at ``frames``: the first as
        ``eval_video``, any others as ``eval_video_1``, ``eval_video_2``..."""
        if self._active and paths:
            self._guard("log of the video", lambda: self._run.log({"frames": frames, **{
                "eval_video" + (f"_{i}" if i else ""): self._wandb.Video(str(p))
                for i, p in enumerate(paths)}}))

    def finish(self, timeout: float = FINISH_TIMEOUT_S) -> None:
        """Finishes the wandb run, waiting at most ``timeout`` seconds (idempotent)."""
        run, self._run, self._active = self._run, None, False
        if run is None:
            return
        done = threading.Event()
        failure: list[BaseException] = []

        def finish_run() -> None:
            try:
                run.finish()
            except Exception as err:  # noqa: BLE001 - reported below, in the run's thread
                failure.append(err)
            finally:
                done.set()

        threading.Thread(target=finish_run, name="rlstruct-wandb-finish", daemon=True).start()
        if not done.wait(timeout):
            _warn(f"wandb finish did not end within {timeout:.0f} s; the run goes on without "
                  "waiting (its wandb files may lack the last rows)")
        elif failure:
            _warn(f"wandb finish failed: {type(failure[0]).__name__}: {failure[0]}")

    def _start(self, options: TrackingOptions, config: dict[str, Any]) -> None:
        self._wandb = wandb = importlib.import_module("wandb")
        record = self.folder / WANDB_FILE
        saved = _read_record(record)
        run_id = saved.get("id") or secrets.token_hex(6)  # wandb ids: [a-z0-9]
        self._run = wandb.init(
            project=options.project, group=options.group, tags=list(options.tags) or None,
            name=self.folder.name, id=run_id, resume="allow",
            settings=wandb.Settings(console="off", quiet=True))  # stdout: the run's
        self._run.config.update(config, allow_val_change=True)  # a resume adds its session
        self._run.define_metric("frames")
        self._run.define_metric("*", step_metric="frames")
        record.write_text(json.dumps({"id": run_id, "project": options.project,
                                      "group": options.group}, indent=2) + "\n")
        self._active = True

    def _guard(self, what: str, call: Callable[[], Any]) -> None:
        try:
            call()
        except Exception as err:  # noqa: BLE001 - tracking never makes a run fail
            self._active = False
            _warn(f"wandb {what} failed: {type(err).__name__}: {str(err).rstrip('. ')}; the "
                  "run goes on without wandb")


def log_videos(run_dir: Path, videos: Sequence[Path], frames: int) -> bool:
    """Adds evaluation ``videos`` to the wandb run of ``run_dir`` (``rlstruct evaluate
    --video``), when that run was tracked (its ``wandb.json``) and wandb is importable; a
    wandb error is one warning. Returns whether the videos were logged."""
    saved = _read_record(Path(run_dir) / WANDB_FILE)
    if not videos or not saved.get("id"):
        return False
    try:
        importlib.import_module("wandb")
    except ImportError:
        _warn(f"{run_dir} was tracked with wandb, which cannot be imported here: the video "
              f"goes to no wandb run ({install_hint('wandb')})")
        return False
    config = _read_record(Path(run_dir) / "config.json")
    tracker = WandbTracker(TrackingOptions(str(saved.get("project")), saved.get("group"), ()),
                           Path(run_dir), config)
    logged = tracker.active
    tracker.log_videos(list(videos), frames)
    logged = logged and tracker.active
    tracker.finish()
    return logged


def _read_record(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)

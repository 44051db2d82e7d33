"""Layout files: the tuner's pick as JSON, written by :func:`write_layout` (``rlstruct tune
--out``), read by :func:`read_layout` and applied to a run config by :func:`apply_layout`
(``--layout``).

The file holds :class:`~rlstruct.runs.layout.LayoutConfig`'s fields plus ``n_timesteps``, the
learner's ``n_threads`` when the tuner chose it (a run's field, ``--n-threads``, not the
layout's), and the measurements under ``"tuned"``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlstruct.errors import ConfigError
from rlstruct.runs.layout import LayoutConfig

__all__ = ["TUNED_FIELDS", "ENV_BACKENDS", "TunedLayout", "write_layout", "read_layout",
           "layout_from_json", "apply_layout"]

#: The layout fields the tuner chooses (the others of LayoutConfig are copied from a base).
TUNED_FIELDS: tuple[str, ...] = ("batcher_device", "n_processes", "n_envs", "pipeline")
#: The env backends a layout file may name (a run's ``--env-backend`` values).
ENV_BACKENDS: tuple[str, ...] = ("gymnasium", "torch", "atari", "envpool", "vector")


@dataclass
class TunedLayout:
    """A layout file read back: the layout, ``T`` and the learner's threads.

    Attributes:
        layout: the LayoutConfig (tuned fields from the file, others as written there).
        n_timesteps: ``T`` of the pick (0: the file has none).
        tuned: the measurements stored with it (objective, steps/s, ...).
        n_threads: the learner's torch threads of the pick (0: the file has none).
        env_backend: the env backend the pick was measured on ("": the file has none).
    """

    layout: LayoutConfig
    n_timesteps: int
    tuned: dict[str, Any] = field(default_factory=dict)
    n_threads: int = 0
    env_backend: str = ""

    def batcher_kwargs(self) -> dict[str, Any]:
        """The layout keyword arguments of :func:`~rlstruct.batchers.make.make_batcher`
        (``device``, ``n_processes``, ``n_timesteps``, ``pipeline``, ``check_devices``); the
        env's ``n_envs`` is ``layout.n_envs``."""
        return {"device": self.layout.batcher_device, "n_processes": self.layout.n_processes,
                "n_timesteps": self.n_timesteps, "pipeline": self.layout.pipeline,
                "check_devices": self.layout.check_devices}


def write_layout(path: str | os.PathLike, pick: TunedLayout) -> Path:
    """Writes a layout file: ``pick.layout``'s fields, ``n_timesteps``, ``n_threads`` and
    ``env_backend`` (when set) and ``"tuned"`` (the measurements); :func:`read_layout` reads
    it back as the same :class:`TunedLayout`.

    Args:
        path: the file.
        pick: the layout, ``T`` and the measurements
            (:func:`rlstruct.tools.tune.searches.tuned_layout` makes one of a tuner's result).

    Returns:
        The path written.
    """
    data: dict[str, Any] = dataclasses.asdict(pick.layout)
    data["n_timesteps"] = pick.n_timesteps
    if pick.n_threads:
        data["n_threads"] = pick.n_threads
    if pick.env_backend:
        data["env_backend"] = pick.env_backend
    data["tuned"] = dict(pick.tuned)
    path = Path(path)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def read_layout(path: str | os.PathLike) -> TunedLayout:
    """Reads a file of :func:`write_layout` (or any JSON of
    LayoutConfig fields and optional ``n_timesteps``, ``n_threads`` and ``env_backend``; a
    missing field keeps LayoutConfig's default).

    Raises:
        ConfigError: not a JSON object, an unknown key, or a field of the wrong type.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read the layout file {path}: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object of LayoutConfig fields")
    data = dict(data)
    tuned = data.pop("tuned", {})
    n_timesteps = data.pop("n_timesteps", None)
    n_threads = data.pop("n_threads", None)
    env_backend = data.pop("env_backend", "")
    if env_backend != "" and env_backend not in ENV_BACKENDS:
        raise ConfigError(f"{path}: env_backend must be one of {list(ENV_BACKENDS)}, got "
                          f"{env_backend!r}")
    fields = {f.name: f for f in dataclasses.fields(LayoutConfig)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{path}: unknown layout keys {unknown}; expected {sorted(fields)}, "
                          "n_timesteps, n_threads, env_backend and tuned")
    defaults = LayoutConfig()
    for name, value in data.items():
        want = type(getattr(defaults, name))
        if type(value) is not want:
            raise ConfigError(f"{path}: {name} must be a {want.__name__}, got {value!r}")
    if n_timesteps is None:
        n_timesteps = 0
    elif type(n_timesteps) is not int or n_timesteps < 1:
        raise ConfigError(f"{path}: n_timesteps must be an int >= 1, got {n_timesteps!r}")
    if n_threads is None:
        n_threads = 0
    elif type(n_threads) is not int or n_threads < 1:
        raise ConfigError(f"{path}: n_threads must be an int >= 1, got {n_threads!r}")
    return TunedLayout(LayoutConfig(**data), n_timesteps, tuned, n_threads, env_backend)


def layout_from_json(path: str | os.PathLike) -> LayoutConfig:
    """The LayoutConfig of a layout file (``LayoutConfig.from_json``); ``n_timesteps`` and the
    measurements are dropped (see :func:`read_layout`)."""
    return read_layout(path).layout


def apply_layout(cfg: Any, path: str | os.PathLike) -> Any:
    """Sets the tuned fields of a run config from a layout file, in place, and returns it.

    ``cfg.layout``'s ``batcher_device``, ``n_processes``, ``n_envs`` and ``pipeline``, and
    ``cfg.n_timesteps``, ``cfg.n_threads`` and ``cfg.env_backend`` when the file has them
    (the backend the layout was measured on); the learner and evaluation devices and
    ``check_devices`` stay the config's.

    Args:
        cfg: a :class:`~rlstruct.runs.run.RunConfig` (anything with ``layout`` and ``n_timesteps``).
        path: a file of :func:`write_layout`.
    """
    tuned = read_layout(path)
    cfg.layout = dataclasses.replace(
        cfg.layout, **{name: getattr(tuned.layout, name) for name in TUNED_FIELDS})
    if tuned.n_timesteps:
        cfg.n_timesteps = tuned.n_timesteps
    if tuned.n_threads:
        cfg.n_threads = tuned.n_threads
    if tuned.env_backend:
        cfg.env_backend = tuned.env_backend
    return cfg

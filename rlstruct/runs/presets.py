"""Named hyperparameter sets of an algorithm: ``--preset atari``, ``--preset mujoco``.

A :class:`Preset` is plain data: the config values of a published, tested setting (field names
of the algorithm's ``Config``, the layout's fields such as ``n_envs`` or ``pipeline`` among
them), optionally refined per env id, as rl-zoo's ``hyperparams/*.yml`` are. An algorithm lists
its presets in ``Config.presets``; the command line applies one with ``--preset NAME`` and every
other flag given overrides its values (:func:`preset_default`); from Python,
``Config.from_preset(NAME, **overrides)`` does the same. The preset's name is recorded in the
config (``config.json``'s ``preset``).

Examples:
    >>> from rlstruct.algos.ppo import Config
    >>> cfg = Config.from_preset("atari", env_id="ALE/Breakout-v5", seed=3)
    >>> cfg.preset, cfg.env_id, cfg.n_epochs, cfg.layout.n_envs, cfg.seed
    ('atari', 'ALE/Breakout-v5', 4, 4, 3)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rlstruct.errors import ConfigError

__all__ = ["Preset", "build_preset", "command_line_config", "preset_help", "preset_in_args"]

C = TypeVar("C")


@dataclass(frozen=True)
class Preset:
    """One named hyperparameter set.

    Args:
        about: one line for ``--help``: what it is for and where its values come from.
        values: config field -> value (a layout field by its own name, e.g. ``n_envs``).
        per_env: env id -> values that refine ``values`` for that env (e.g. rl-zoo's per-task
            PPO settings for Hopper-v5).
    """

    about: str
    values: Mapping[str, Any]
    per_env: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def values_for(self, env_id: str) -> dict[str, Any]:
        """``values`` refined by ``per_env[env_id]`` (when the env has its own)."""
        return {**self.values, **self.per_env.get(env_id, {})}


def build_preset(config_class: type[C], name: str, overrides: Mapping[str, Any]) -> C:
    """``config_class`` with the preset ``name``'s values (those of the env id that
    ``overrides`` or the preset gives), then ``overrides`` on top, and ``preset=name``.

    Raises:
        ConfigError: the algorithm has no preset ``name``, or a value names no config field.
    """
    presets: Mapping[str, Preset] = getattr(config_class, "presets", {})
    if name not in presets:
        known = ", ".join(sorted(presets)) or "none"
        raise ConfigError(f"{config_class.__module__}.{config_class.__name__} has no preset "
                          f"{name!r}; its presets: {known}")
    preset = presets[name]
    fields = {f.name: f for f in dataclasses.fields(config_class)}  # type: ignore[arg-type]
    env_id = overrides.get("env_id", preset.values.get("env_id", fields["env_id"].default))
    values = {**preset.values_for(env_id), **overrides, "preset": name}
    base_layout = fields["layout"].default_factory()  # type: ignore[misc]  # the config's own
    layout_fields = {f.name for f in dataclasses.fields(base_layout)}
    unknown = sorted(k for k in values if k not in fields and k not in layout_fields)
    if unknown:
        raise ConfigError(f"preset {name!r} of {config_class.__name__} sets {unknown}, which "
                          f"are not fields of its config")
    top = {k: v for k, v in values.items() if k in fields}
    layout = dataclasses.replace(top.pop("layout", base_layout), **{
        k: v for k, v in values.items() if k in layout_fields and k not in fields})
    return config_class(**top, layout=layout)


def preset_help(config_class: type) -> str:
    """The presets of an algorithm as lines for ``--help`` ('' when it has none)."""
    presets: Mapping[str, Preset] = getattr(config_class, "presets", {})
    if not presets:
        return ""
    lines = ["presets (--preset NAME; flags given override its values):"]
    lines += [f"  {name}: {p.about}" for name, p in sorted(presets.items())]
    return "\n".join(lines)


def preset_in_args(args: Sequence[str]) -> str | None:
    """The NAME of ``--preset NAME`` or ``--preset=NAME`` in a command line (the last one), or
    None.

    Raises:
        ConfigError: ``--preset`` ends the command line without a name.
    """
    name = None
    for i, arg in enumerate(args):
        if arg == "--preset":
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ConfigError("--preset needs a name (see --help for the algorithm's presets)")
            name = args[i + 1]
        elif arg.startswith("--preset="):
            name = arg.split("=", 1)[1]
    return None if name in (None, "None") else name


def command_line_config(config_class: type[C], args: Sequence[str] | None = None,
                        prog: str | None = None) -> C:
    """``tyro.cli(config_class)`` with ``--preset NAME``'s values (for the env id the command
    line gives) as the defaults, so that every other flag overrides them; the help lists the
    presets. Nothing outside the config is read (that is
    :func:`~rlstruct.runs.resolve.resolve`'s step).

    Args:
        config_class: the algorithm's ``Config``.
        args: the arguments (default: ``sys.argv[1:]``).
        prog: the program's name in messages and ``--help``.

    Raises:
        ConfigError: an unknown preset, or ``--preset`` without a name.
    """
    import sys

    import tyro

    description = "\n\n".join(filter(None, [config_class.__doc__, preset_help(config_class)]))
    name = preset_in_args(sys.argv[1:] if args is None else args)
    default = None
    if name is not None:  # first the env id the command line gives, then its preset values
        first = tyro.cli(config_class, args=args, prog=prog, description=description,
                         default=build_preset(config_class, name, {}))
        default = build_preset(config_class, name, {"env_id": first.env_id})
    return tyro.cli(config_class, args=args, prog=prog, description=description, default=default)

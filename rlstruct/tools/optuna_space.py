"""The search space of ``rlstruct sweep --search optuna``: a JSON file, checked against the
algorithm's ``Config`` before anything starts.

The file is one JSON object with an entry per config field, named as the ``Config`` spells it
(``n_epochs``) or as its flag does (``n-epochs``)::

    {
      "lr":          {"low": 1e-4, "high": 3e-3, "log": true},
      "n_epochs":    {"low": 2, "high": 20},
      "n_timesteps": {"low": 16, "high": 128, "step": 16},
      "gae_lambda":  {"low": 0.8, "high": 0.99},
      "adv_norm":    {"choices": ["minibatch", "batch"]},
      "anneal_lr":   {"choices": [true, false]}
    }

- A **range** has ``low`` and ``high`` (both included), optionally ``log`` (draw on a log scale;
  ``low > 0``), ``step`` (a grid from ``low``; not with ``log`` for a float, nor a step other
  than 1 with ``log`` for an int) and ``type``. A field typed ``int`` draws integers
  (``suggest_int``), one typed ``float`` floats (``suggest_float``); ``"type": "int"`` draws
  integers for a float field. Only numeric fields take a range.
- A **choice** has ``choices``: a non-empty list of distinct JSON scalars (strings, numbers,
  ``true``/``false``, ``null``), each of a type the field takes (a ``Literal`` field: one of its
  values; a ``bool`` field: ``true`` or ``false``).

Fields the sweep sets for every session (``seed``, ``runs_dir``, ``n_threads``, ``resume``) are
not searchable. Every problem of the file is reported at once, as one
:class:`~rlstruct.errors.ConfigError` naming each bad entry.

Example:
    >>> import json, tempfile, pathlib
    >>> from rlstruct.algos.ppo import Config
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "space.json"
    >>> _ = path.write_text(json.dumps({"lr": {"low": 1e-4, "high": 1e-2, "log": True},
    ...                                 "n-epochs": {"low": 2, "high": 10}}))
    >>> space = read_space(path, Config)
    >>> [(p.name, p.kind, p.log) for p in space.values()]
    [('lr', 'float', True), ('n_epochs', 'int', False)]
    >>> _ = path.write_text(json.dumps({"lrr": {"low": 0, "high": 1}}))
    >>> read_space(path, Config)
    Traceback (most recent call last):
    ...
    rlstruct.errors.ConfigError: space file ...: entry 'lrr': Config has no such field (did ...
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tyro

from rlstruct.errors import ConfigError

__all__ = ["Param", "read_space", "parse_space", "config_fields", "SWEEP_SET"]

#: Config fields the sweep sets for every session: not searchable.
SWEEP_SET = frozenset({"seed", "runs_dir", "n_threads", "resume"})

_RANGE_KEYS = {"low", "high", "log", "step", "type"}
_Scalar = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Param:
    """One searched config field.

    Attributes:
        name: the ``Config`` field (``n_epochs``).
        kind: ``int`` or ``float`` (a range), or ``choices``.
        low, high: the range's bounds, both included (None for choices).
        log: draw on a log scale.
        step: the range's grid step (None: continuous for a float, 1 for an int).
        choices: the values of a choice (empty for a range).
    """

    name: str
    kind: Literal["int", "float", "choices"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """The value an Optuna trial draws for this field (``trial.suggest_*``)."""
        if self.kind == "choices":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high),
                                     step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high),
                                   step=self.step, log=self.log)

    def to_json(self) -> dict[str, Any]:
        """The entry as the space file writes it (kept with the study)."""
        if self.kind == "choices":
            return {"choices": list(self.choices)}
        entry = {"low": self.low, "high": self.high, "log": self.log, "type": self.kind}
        return entry if self.step is None else {**entry, "step": self.step}


def config_fields(config: type) -> dict[str, Any]:
    """The fields a command line of ``config`` sets, with their types: its dataclass fields,
    those of a nested dataclass whose flags carry no prefix (``tyro.conf.OmitArgPrefixes``, as
    ``RunConfig.layout``) in its place.

    Args:
        config: an algorithm's ``Config`` dataclass.

    Returns:
        ``{field name: type}`` (``Annotated`` stripped).
    """
    hints = typing.get_type_hints(config, include_extras=True)
    found: dict[str, Any] = {}
    for field in dataclasses.fields(config):
        hint = hints[field.name]
        base, extras = _strip(hint)
        if dataclasses.is_dataclass(base) and tyro.conf.OmitArgPrefixes in extras:
            found.update(config_fields(base))
        elif not dataclasses.is_dataclass(base):
            found[field.name] = base
    return found


def read_space(path: str | Path, config: type) -> dict[str, Param]:
    """The search space of a space file (see the module's docstring), checked against ``config``.

    Args:
        path: the JSON file.
        config: the algorithm's ``Config`` dataclass, whose fields the entries must name.

    Returns:
        ``{field name: Param}``, in the file's order.

    Raises:
        ConfigError: the file cannot be read, is not JSON, or has bad entries (every problem at
            once, each naming its entry).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise ConfigError(f"space file {path}: cannot read it: {err}") from None
    except ValueError as err:
        raise ConfigError(f"space file {path}: not JSON: {err}") from None
    return parse_space(data, config, where=f"space file {path}")


def parse_space(data: Any, config: type, where: str = "space") -> dict[str, Param]:
    """The search space of an already parsed space file (see :func:`read_space`).

    Raises:
        ConfigError: bad entries, every problem at once.
    """
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(f"{where}: expected a non-empty JSON object of config fields, got "
                          f"{json.dumps(data)[:80]}")
    fields = config_fields(config)
    space: dict[str, Param] = {}
    problems: list[str] = []
    for key, entry in data.items():
        name = str(key).replace("-", "_")
        if name in space:
            problems.append(f"entry {key!r}: {name!r} is given twice")
        elif name in SWEEP_SET:
            problems.append(f"entry {key!r}: the sweep sets {name} for every session; it is "
                            "not searchable")
        elif name not in fields:
            near = difflib.get_close_matches(name, list(fields), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            problems.append(f"entry {key!r}: {config.__name__} has no such field{hint}")
        else:
            param, errors = _param(name, entry, fields[name])
            problems += [f"entry {key!r}: {e}" for e in errors]
            if param is not None and not errors:
                space[name] = param
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems))
    return space


def _param(name: str, entry: Any, hint: Any) -> tuple[Param | None, list[str]]:
    """One entry as a Param, or the problems with it."""
    if not isinstance(entry, Mapping):
        return None, [f"expected an object with low/high or choices, got {json.dumps(entry)}"]
    if "choices" in entry:
        return _choices(name, entry, hint)
    unknown = sorted(set(entry) - _RANGE_KEYS)
    if unknown or not {"low", "high"} <= set(entry):
        return None, [f"a range has low and high, optionally log, step and type; a choice has "
                      f"choices (got keys {sorted(entry)})"]
    numeric = _numeric_kind(hint)
    if numeric is None:
        return None, [f"the field is {_name(hint)}, not a number: give choices instead of a range"]
    kind = entry.get("type", numeric)
    problems = []
    if kind not in ("int", "float"):
        problems.append(f"type must be 'int' or 'float', got {kind!r}")
    elif kind == "float" and numeric == "int":
        problems.append("type 'float' for an int field: the field takes integers only")
    low, high, log, step = (entry.get(k) for k in ("low", "high", "log", "step"))
    problems += _range_problems(kind, low, high, log, step)
    if problems:
        return None, problems
    return Param(name, kind, low, high, bool(log), step), []


def _range_problems(kind: str, low: Any, high: Any, log: Any, step: Any) -> list[str]:
    """What is wrong with a range's low, high, log and step for a draw of ``kind``."""
    problems = []
    for label, value in (("low", low), ("high", high)) + ((("step", step),) if step is not None
                                                          else ()):
        if not _is_number(value) or (kind == "int" and not isinstance(value, int)):
            problems.append(f"{label} must be {'an integer' if kind == 'int' else 'a number'}, "
                            f"got {json.dumps(value)}")
    if log is not None and not isinstance(log, bool):
        problems.append(f"log must be true or false, got {json.dumps(log)}")
    if problems:
        return problems
    if low > high:
        problems.append(f"low ({low}) must be <= high ({high})")
    if log and low <= 0:
        problems.append(f"log needs low > 0, got low {low}")
    if step is not None and step <= 0:
        problems.append(f"step must be > 0, got {step}")
    if log and step is not None and (kind == "float" or step != 1):
        problems.append("log and step do not go together (Optuna's rule): give one")
    return problems


def _choices(name: str, entry: Mapping[str, Any], hint: Any) -> tuple[Param | None, list[str]]:
    """A choice entry as a Param, or the problems with it."""
    choices = entry["choices"]
    problems = []
    if set(entry) != {"choices"}:
        problems.append(f"a choice has only choices, got also {sorted(set(entry) - {'choices'})}")
    if not isinstance(choices, list) or not choices:
        return None, [*problems, f"choices must be a non-empty list, got {json.dumps(choices)}"]
    for value in choices:
        if not isinstance(value, _Scalar):
            problems.append(f"choice {json.dumps(value)} is not a JSON scalar (string, number, "
                            "boolean or null)")
        elif not _takes(hint, value):
            problems.append(f"choice {json.dumps(value)} is not a value of the field "
                            f"({_name(hint)})")
    if len({json.dumps(v) for v in choices}) != len(choices):
        problems.append(f"choices must be distinct, got {json.dumps(choices)}")
    return (None if problems else Param(name, "choices", choices=tuple(choices))), problems


# ------------------------------------------------------------------------------ field types
def _strip(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    """``hint`` without ``Annotated``, and the annotations."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *extras = typing.get_args(hint)
        return base, tuple(extras)
    return hint, ()


def _arms(hint: Any) -> list[Any]:
    """The members of a union (``X | None``), else ``[hint]``."""
    hint = _strip(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [a for arm in typing.get_args(hint) for a in _arms(arm)]
    return [hint]


def _numeric_kind(hint: Any) -> str | None:
    """``float`` or ``int`` when the field takes such numbers, else None."""
    arms = _arms(hint)
    return "float" if float in arms else "int" if int in arms else None


def _takes(hint: Any, value: Any) -> bool:
    """Whether a field of type ``hint`` takes the JSON scalar ``value`` (types it cannot judge
    take anything: the session's own parse has the last word)."""
    for arm in _arms(hint):
        if typing.get_origin(arm) is Literal:
            if any(value == v and type(value) is type(v) for v in typing.get_args(arm)):
                return True
        elif arm is type(None):
            if value is None:
                return True
        elif arm is bool:
            if isinstance(value, bool):
                return True
        elif arm is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif arm is float:
            if _is_number(value):
                return True
        elif arm is str:
            if isinstance(value, str):
                return True
        else:
            return True
    return False


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _name(hint: Any) -> str:
    """A type as a reader writes it."""
    return " | ".join(f"one of {list(typing.get_args(a))}" if typing.get_origin(a) is Literal
                      else getattr(a, "__name__", str(a)) for a in _arms(hint)
                      ).replace("NoneType", "None")

"""Typed dataclass configs turned into command lines.

An algorithm's config is a dataclass whose every field is documented with :func:`arg`;
:func:`parse_config` builds an ``argparse`` parser from it (one ``--field-name`` flag per field)
and returns the instance, so a typo'd flag or a bad value fails at parse time (exit code 2).

Supported annotations (``from __future__ import annotations`` is fine):

=============================================  ==============================================
annotation                                     command line
=============================================  ==============================================
``int``, ``float``, ``str``, ``Path``          ``--lr 3e-4`` (ints also take ``1e6``)
``bool``                                       ``--cuda`` / ``--no-cuda``
``X | None``, ``Optional[X]``                  as ``X``, or the word ``none``
``Literal["a", "b"]``                          ``--mode a`` (choices checked)
``tuple[int, ...]``, ``list[float]``           ``--sizes 64 64`` (any count, zero included)
``tuple[int, int]``                            exactly two values
=============================================  ==============================================

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Config:
    ...     '''Train something.'''
    ...     lr: float = arg(3e-4, "learning rate")
    ...     hidden: tuple[int, ...] = arg((64, 64), "hidden layer sizes")
    ...     cuda: bool = arg(False, "train on the GPU")
    >>> parse_config(Config, ["--lr", "0.01", "--hidden", "32", "--cuda"])
    Config(lr=0.01, hidden=(32,), cuda=True)
    >>> config_to_dict(Config())
    {'lr': 0.0003, 'hidden': [64, 64], 'cuda': False}
"""

from __future__ import annotations

import argparse
import collections.abc
import copy
import dataclasses
import enum
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import numpy as np
import torch

__all__ = ["arg", "parse_config", "build_parser", "config_to_dict"]

T = TypeVar("T")

_FIELD_KWARGS = frozenset({"init", "repr", "hash", "compare", "kw_only", "metadata"})
_SCALARS: dict[type, str] = {int: "int", float: "float", str: "str", Path: "path"}


def arg(default: Any, help: str, **kw: Any) -> Any:
    """Declare a documented config field: a :func:`dataclasses.field` carrying its help text.

    Args:
        default: the default value; ``dataclasses.MISSING`` makes the flag required. A list, dict
            or set default is copied per instance (through ``default_factory``).
        help: one line saying what the field does; shown by ``--help`` with the default.
        **kw: :func:`dataclasses.field` arguments (``init``, ``repr``, ``compare``, ``metadata``,
            ...) pass through; anything else (``metavar``, ...) goes to ``add_argument``.

    Returns:
        The ``dataclasses.Field`` to assign in the class body.
    """
    field_kw = {k: v for k, v in kw.items() if k in _FIELD_KWARGS}
    argparse_kw = {k: v for k, v in kw.items() if k not in _FIELD_KWARGS}
    metadata = {**dict(field_kw.pop("metadata", None) or {}), "help": help}
    if argparse_kw:
        metadata["argparse"] = argparse_kw
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(
            default_factory=lambda: copy.deepcopy(value), metadata=metadata, **field_kw
        )
    return dataclasses.field(default=default, metadata=metadata, **field_kw)


def parse_config(
    cls: type[T], argv: Sequence[str] | None = None, description: str | None = None
) -> T:
    """Parse a command line into an instance of the dataclass ``cls``.

    Args:
        cls: a (frozen or not) dataclass type; every ``init`` field becomes ``--field-name``.
        argv: the arguments to parse; ``None`` reads ``sys.argv[1:]``.
        description: text for ``--help``; defaults to the class docstring.

    Returns:
        ``cls(**parsed)``: flags not given keep the dataclass defaults (``__post_init__`` runs).

    Raises:
        SystemExit: code 2 (argparse's error) for an unknown flag, a bad value, a missing required
            flag, or a ``ValueError`` raised by the dataclass's ``__post_init__``.
        TypeError: ``cls`` is not a dataclass or a field has an unsupported annotation.
    """
    parser = build_parser(cls, description)
    namespace = parser.parse_args(argv)
    try:
        return cls(**vars(namespace))
    except ValueError as err:  # ConfigError is a ValueError: report it the argparse way.
        parser.error(f"invalid configuration: {err}")
        raise  # unreachable: parser.error exits


def build_parser(cls: type, description: str | None = None) -> argparse.ArgumentParser:
    """Build the ``argparse`` parser :func:`parse_config` uses (exposed for composition/tests).

    Args:
        cls: a dataclass type.
        description: text for ``--help``; defaults to the class docstring.

    Returns:
        A parser whose defaults are suppressed, so its namespace holds only the given flags.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"parse_config needs a dataclass type, got {cls!r}")
    if description is None:
        doc = inspect.getdoc(cls) or ""
        # dataclass invents "Name(field: type = ...)" when there is no docstring: not a description.
        description = None if doc.startswith(f"{cls.__name__}(") else doc
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.init:
            _add_field(parser, field, hints[field.name])
    return parser


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Turn a config (dataclass, mapping, namespace or ``None``) into a JSON-safe dict.

    Tuples become lists; paths, devices, dtypes and types become strings; enums their value;
    non-finite floats the strings ``"nan"``, ``"inf"``, ``"-inf"``; tensors and numpy scalars
    plain numbers or lists; anything else its ``repr``.

    Raises:
        TypeError: ``cfg`` is none of the accepted kinds.
    """
    if cfg is None:
        return {}
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: _jsonable(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, Mapping):
        return {str(k): _jsonable(v) for k, v in cfg.items()}
    if isinstance(cfg, argparse.Namespace):
        return {k: _jsonable(v) for k, v in vars(cfg).items()}
    raise TypeError(
        f"config_to_dict needs a dataclass instance, a mapping or a Namespace, got {type(cfg)}"
    )


# --------------------------------------------------------------------------- internals


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_to_dict(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return [_jsonable(v) for v in sorted(value, key=repr)]
    if isinstance(value, torch.Tensor):
        return _jsonable(value.detach().cpu().tolist())
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (Path, torch.device, torch.dtype)):
        return str(value)
    if isinstance(value, type) or callable(value):
        module = getattr(value, "__module__", None)
        name = getattr(value, "__qualname__", None)
        if name is not None:
            return f"{module}.{name}" if module else name
    return repr(value)


def _add_field(parser: argparse.ArgumentParser, field: dataclasses.Field, hint: Any) -> None:
    flag = "--" + field.name.replace("_", "-")
    kwargs: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS}
    if field.default is not dataclasses.MISSING:
        default_text = f"default: {_show(field.default)}"
    elif field.default_factory is not dataclasses.MISSING:
        default_text = f"default: {_show(field.default_factory())}"
    else:
        default_text = "required"
        kwargs["required"] = True
    text = field.metadata.get("help", "")
    text = f"{text} ({default_text})" if text else f"({default_text})"
    kwargs["help"] = text.replace("%", "%%")  # argparse %-formats help strings

    try:
        kwargs.update(_argparse_kwargs(hint))
    except TypeError as err:
        raise TypeError(f"field {field.name!r}: {err}") from None
    kwargs.update(field.metadata.get("argparse", {}))
    parser.add_argument(flag, **kwargs)


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return " ".join(_show(v) for v in value) or "(empty)"
    return "none" if value is None else str(value)


def _split_optional(hint: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); ``X`` -> (X, False)."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported union {hint!r} (only X | None is)")
        return args[0], True
    return hint, False


def _argparse_kwargs(hint: Any) -> dict[str, Any]:
    base, optional = _split_optional(hint)
    origin = typing.get_origin(base)
    if base is bool:
        return {"action": argparse.BooleanOptionalAction}
    if base in _SCALARS:
        return {"type": _converter(base, optional), "metavar": _SCALARS[base].upper()}
    if origin is Literal:
        values = list(typing.get_args(base))
        if None in values:
            optional = True
            values.remove(None)
        choices = [*values, None] if optional else values
        return {"type": _literal_converter(values, optional), "choices": choices,
                "metavar": "{" + ",".join(map(_show, choices)) + "}"}
    if origin in (tuple, list, collections.abc.Sequence):
        return _sequence_kwargs(base, origin, optional)
    raise TypeError(f"unsupported annotation {hint!r}")


def _sequence_kwargs(hint: Any, origin: Any, optional: bool) -> dict[str, Any]:
    args = typing.get_args(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        elems, count = [args[0]], None
    elif origin is tuple and args:
        elems, count = list(args), len(args)
    elif origin is not tuple and len(args) == 1:
        elems, count = [args[0]], None
    else:
        raise TypeError(f"unsupported sequence {hint!r} (give the element type)")
    for elem in elems:
        if elem not in _SCALARS:
            raise TypeError(f"unsupported element type {elem!r} in {hint!r}")
    converters = [_converter(e, False) for e in elems]
    nargs: int | str = "*" if count is None else count
    if optional and count is not None:
        nargs = "+"  # room for the single word "none"
    return {
        "nargs": nargs,
        "action": _SequenceAction,
        "converters": converters,
        "count": count,
        "optional": optional,
        "factory": list if origin is list else tuple,
        "metavar": _SCALARS[elems[0]].upper() if len(set(elems)) == 1 else None,
    }


def _converter(kind: type, optional: bool) -> Callable[[str], Any]:
    name = _SCALARS[kind]

    def convert(text: str) -> Any:
        if optional and text.lower() == "none":
            return None
        try:
            if kind is int:
                return _to_int(text)
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {name} value: {text!r}") from None

    convert.__name__ = f"{name} or none" if optional else name
    return convert


def _to_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        number = float(text)  # accept "1e6" for frame budgets, but only when integral
        if not number.is_integer():
            raise
        return int(number)


def _literal_converter(values: list[Any], optional: bool) -> Callable[[str], Any]:
    by_text = {str(v): v for v in values}

    def convert(text: str) -> Any:
        if optional and text.lower() == "none":
            return None
        return by_text.get(text, text)  # unknown text fails argparse's choices check

    convert.__name__ = "choice"
    return convert


class _SequenceAction(argparse.Action):
    """Converts each value with its element converter and builds the tuple/list."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        *,
        converters: list[Callable[[str], Any]],
        count: int | None,
        optional: bool,
        factory: type,
        **kwargs: Any,
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.converters = converters
        self.count = count
        self.optional = optional
        self.factory = factory

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        texts = list(values)
        if self.optional and len(texts) == 1 and texts[0].lower() == "none":
            setattr(namespace, self.dest, None)
            return
        if self.count is not None and len(texts) != self.count:
            raise argparse.ArgumentError(
                self, f"expected {self.count} values, got {len(texts)}: {' '.join(texts)}"
            )
        try:
            items = [
                self.converters[i if len(self.converters) > 1 else 0](t)
                for i, t in enumerate(texts)
            ]
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentError(self, str(err)) from None
        setattr(namespace, self.dest, self.factory(items))

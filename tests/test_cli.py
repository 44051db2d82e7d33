"""rlstruct.cli: dataclass configs -> argparse, every supported annotation, every error path."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Union

import numpy as np
import pytest
import torch

from rlstruct.cli import arg, build_parser, config_to_dict, parse_config
from rlstruct.errors import ConfigError


@dataclass(frozen=True)
class AllTypes:
    """Every supported field type, for round trips."""

    seed: int = arg(1, "random seed")
    lr: float = arg(3e-4, "learning rate (100% of the step)")
    name: str = arg("run", "run name")
    root: Path = arg(Path("runs"), "where runs go")
    cuda: bool = arg(False, "train on the GPU")
    anneal: bool = arg(True, "anneal the learning rate")
    max_grad_norm: float | None = arg(None, "clip gradients (none: no clipping)")
    total_frames: Optional[int] = arg(1000, "frame budget")  # noqa: UP045  (the old spelling)
    mode: Literal["fast", "slow"] = arg("fast", "speed")
    n_step: Literal[1, 3, 5] = arg(1, "TD horizon")
    schedule_kind: Literal["linear", "cosine"] | None = arg(None, "lr schedule")
    hidden: tuple[int, ...] = arg((64, 64), "hidden layer sizes")
    betas: tuple[float, float] = arg((0.9, 0.999), "Adam betas")
    milestones: list[float] = arg([0.5, 0.75], "lr milestones (fractions)")
    tags: list[str] = arg([], "free-form tags")
    crop: tuple[int, int] | None = arg(None, "crop size")
    plain: int = 7


@dataclass
class Mutable:
    steps: int = arg(10, "steps")


@dataclass
class NoDoc:
    x: int = 1


@dataclass(frozen=True)
class Required:
    """A config with a required field."""

    env: str = arg(dataclasses.MISSING, "environment id")
    seed: int = arg(0, "seed")


@dataclass(frozen=True)
class Validated:
    """A config that validates itself."""

    n_envs: int = arg(4, "envs per worker")

    def __post_init__(self) -> None:
        if self.n_envs < 1:
            raise ConfigError(f"n_envs must be >= 1, got {self.n_envs}")


def to_argv(cfg: AllTypes) -> list[str]:
    """The command line that should reproduce ``cfg``."""
    argv: list[str] = []
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        flag = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is None:
            argv += [flag, "none"]
        elif isinstance(value, (tuple, list)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


# ------------------------------------------------------------------ round trips


def test_no_arguments_gives_the_defaults() -> None:
    assert parse_config(AllTypes, []) == AllTypes()


def test_every_field_type_round_trips() -> None:
    cfg = AllTypes(
        seed=42, lr=0.01, name="my-run", root=Path("/tmp/x"), cuda=True, anneal=False,
        max_grad_norm=0.5, total_frames=None, mode="slow", n_step=3, schedule_kind="cosine",
        hidden=(32,), betas=(0.8, 0.99), milestones=[0.1], tags=["a", "b"], crop=(84, 84), plain=9,
    )
    parsed = parse_config(AllTypes, to_argv(cfg))
    assert parsed == cfg
    assert type(parsed.hidden) is tuple and type(parsed.milestones) is list
    assert type(parsed.n_step) is int and isinstance(parsed.root, Path)
    assert parse_config(AllTypes, to_argv(AllTypes())) == AllTypes()


def test_flags_use_dashes_and_values_are_typed() -> None:
    cfg = parse_config(AllTypes, ["--total-frames", "1e6", "--max-grad-norm", "0.5",
                                  "--hidden", "128", "64", "32", "--n-step", "5"])
    assert cfg.total_frames == 1_000_000 and isinstance(cfg.total_frames, int)
    assert cfg.max_grad_norm == 0.5
    assert cfg.hidden == (128, 64, 32)
    assert cfg.n_step == 5


def test_empty_variable_sequence_and_none_values() -> None:
    cfg = parse_config(AllTypes, ["--hidden", "--crop", "none", "--schedule-kind", "none",
                                  "--total-frames", "None"])
    assert cfg.hidden == () and cfg.crop is None and cfg.schedule_kind is None
    assert cfg.total_frames is None


def test_mutable_defaults_are_not_shared() -> None:
    a, b = AllTypes(), AllTypes()
    assert a.milestones == b.milestones == [0.5, 0.75]
    assert a.milestones is not b.milestones


def test_non_frozen_dataclass_and_sys_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["prog", "--steps", "3"])
    cfg = parse_config(Mutable)
    assert cfg == Mutable(steps=3)


def test_required_field() -> None:
    assert parse_config(Required, ["--env", "CartPole-v1"]) == Required(env="CartPole-v1")
    with pytest.raises(SystemExit) as info:
        parse_config(Required, [])
    assert info.value.code == 2


# ------------------------------------------------------------------ errors at parse time


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--learning-rate", "0.1"], "unrecognized arguments: --learning-rate"),
        (["--seed", "abc"], "invalid int value: 'abc'"),
        (["--seed", "1.5"], "invalid int value: '1.5'"),
        (["--lr", "fast"], "invalid float value: 'fast'"),
        (["--mode", "medium"], "invalid choice"),
        (["--n-step", "2"], "invalid choice"),
        (["--betas", "0.9"], "argument --betas: expected 2 arguments"),
        (["--crop", "1", "2", "3"], "expected 2 values, got 3"),
        (["--hidden", "64", "x"], "invalid int value: 'x'"),
        (["--hidden", "none"], "invalid int value: 'none'"),  # not optional
        (["--cuda", "yes"], "unrecognized arguments: yes"),
    ],
)
def test_bad_command_lines_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_config(AllTypes, argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_post_init_validation_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_config(Validated, ["--n-envs", "0"])
    assert info.value.code == 2
    assert "n_envs must be >= 1, got 0" in capsys.readouterr().err


def test_unsupported_annotations_raise_type_error_naming_the_field() -> None:
    @dataclass
    class Bad:
        table: dict[str, int] = dataclasses.field(default_factory=dict)

    @dataclass
    class BadUnion:
        x: Union[int, str] = 1  # noqa: UP007

    @dataclass
    class BadTuple:
        x: tuple = ()

    with pytest.raises(TypeError, match="field 'table'"):
        parse_config(Bad, [])
    with pytest.raises(TypeError, match=r"field 'x'.*union"):
        parse_config(BadUnion, [])
    with pytest.raises(TypeError, match="field 'x': unsupported annotation"):
        parse_config(BadTuple, [])
    with pytest.raises(TypeError, match="dataclass"):
        parse_config(dict, [])  # type: ignore[type-var]


# ------------------------------------------------------------------ help


def test_help_shows_docstring_help_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_config(AllTypes, ["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "Every supported field type, for round trips." in out
    assert "--cuda, --no-cuda" in out
    assert "learning rate (100% of the step) (default: 0.0003)" in out
    assert "(default: 64 64)" in out
    assert "(default: none)" in out
    assert "{fast,slow}" in out


def test_description_argument_and_missing_docstring() -> None:
    assert build_parser(AllTypes, "custom").description == "custom"
    assert build_parser(NoDoc).description is None  # not dataclass's invented "NoDoc(x: int=1)"
    assert "(required)" in build_parser(Required).format_help()


def test_arg_metadata_and_passthrough() -> None:
    @dataclass
    class Extra:
        x: int = arg(3, "the x", repr=False, metavar="X_VALUE", metadata={"unit": "steps"})

    (field,) = dataclasses.fields(Extra)
    assert field.metadata["help"] == "the x" and field.metadata["unit"] == "steps"
    assert field.repr is False
    assert "--x X_VALUE" in build_parser(Extra).format_help()
    assert "the x" in build_parser(Extra).format_help()


# ------------------------------------------------------------------ config_to_dict


class Colour(enum.Enum):
    RED = "red"


@dataclass
class Inner:
    size: tuple[int, int] = (2, 3)


def test_config_to_dict_is_json_safe() -> None:
    @dataclass
    class Odd:
        path: Path = Path("/a/b")
        device: torch.device = torch.device("cpu")  # noqa: RUF009
        dtype: torch.dtype = torch.float32
        nan: float = math.nan
        inf: float = -math.inf
        colour: Colour = Colour.RED
        inner: Inner = dataclasses.field(default_factory=Inner)
        scalar: np.float32 = np.float32(0.5)  # noqa: RUF009
        tensor: torch.Tensor = dataclasses.field(default_factory=lambda: torch.tensor([1, 2]))
        table: dict = dataclasses.field(default_factory=lambda: {1: (1, 2)})
        factory: type = Inner

    d = config_to_dict(Odd())
    json.dumps(d, allow_nan=False)  # strict JSON
    assert d["path"] == "/a/b" and d["device"] == "cpu" and d["dtype"] == "torch.float32"
    assert d["nan"] == "nan" and d["inf"] == "-inf" and d["colour"] == "red"
    assert d["inner"] == {"size": [2, 3]} and d["scalar"] == 0.5 and d["tensor"] == [1, 2]
    assert d["table"] == {"1": [1, 2]} and d["factory"].endswith("Inner")


def test_config_to_dict_other_containers() -> None:
    assert config_to_dict(None) == {}
    assert config_to_dict({"a": (1,)}) == {"a": [1]}
    assert config_to_dict(argparse.Namespace(b=Path("x"))) == {"b": "x"}
    assert config_to_dict(AllTypes())["hidden"] == [64, 64]
    with pytest.raises(TypeError, match="dataclass instance"):
        config_to_dict(3)
    with pytest.raises(TypeError):
        config_to_dict(AllTypes)  # the class, not an instance

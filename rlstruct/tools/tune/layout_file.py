"""Layout files written: the tuner's pick as JSON (:func:`write_layout`); the run scaffold reads
them back (:mod:`rlstruct.runs.layout_file`, ``--layout``)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.layout_file import (
    TUNED_FIELDS,
    TunedLayout,
    apply_layout,
    layout_from_json,
    read_layout,
)
from rlstruct.tools.tune.candidates import Candidate
from rlstruct.tools.tune.searches import TuneResult

__all__ = ["TUNED_FIELDS", "TunedLayout", "write_layout", "read_layout", "layout_from_json",
           "apply_layout"]


def write_layout(path: str | os.PathLike, result: TuneResult | Candidate,
                 base: LayoutConfig | None = None, **extra: Any) -> Path:
    """Writes the pick as JSON: LayoutConfig's fields, ``n_timesteps``, and ``"tuned"``.

    Args:
        path: the file.
        result: a TuneResult (its ``best`` and figures) or a Candidate.
        base: the fields the tuner does not choose (devices of the learner and evaluation,
            check_devices); default ``LayoutConfig()``.
        **extra: more entries under ``"tuned"`` (e.g. ``algo``, ``env_id``).

    Returns:
        The path written.
    """
    candidate = result.best if isinstance(result, TuneResult) else result
    data: dict[str, Any] = dataclasses.asdict(candidate.layout(base))
    data["n_timesteps"] = candidate.n_timesteps
    tuned = result.summary() if isinstance(result, TuneResult) else {}
    data["tuned"] = {"label": candidate.label, **tuned, **extra}
    path = Path(path)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path

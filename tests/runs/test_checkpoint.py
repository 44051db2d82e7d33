"""rlstruct.runs.checkpoint: atomic writes, a full disk, loading, RNG states, rebuilding a model."""

from __future__ import annotations

import errno
import random

import numpy as np
import pytest
import torch

import rlstruct.runs.checkpoint as ck
from rlstruct.errors import CheckpointError
from rlstruct.runs.logger import RunLogger


def full_disk_after(n_bytes: int):
    """An ``os.write`` that writes ``n_bytes`` in all, then fails as a full disk does."""
    left = [n_bytes]

    def write(fd: int, data) -> int:
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = ck.os.write(fd, bytes(data[: left[0]]))
        left[0] -= n
        return n

    return write


def test_a_full_disk_is_a_typed_error_naming_the_file_and_keeps_the_last_checkpoint(
    tmp_path, monkeypatch
):
    with RunLogger("t", "Env-v0", None, tmp_path, progress=False) as logger:
        logger.checkpoint({"frames": 1, "w": torch.ones(1000)}, score=1.0)
        monkeypatch.setattr(ck, "_os_write", full_disk_after(100))
        with pytest.raises(CheckpointError) as info:
            logger.checkpoint({"frames": 2, "w": torch.zeros(1000)}, score=2.0)
        monkeypatch.undo()
    folder = logger.dir / "checkpoints"
    message = str(info.value)
    assert str(folder / "latest.pt") in message and "No space left on device (ENOSPC)" in message
    assert "the last good checkpoint" in message and isinstance(info.value, OSError)
    assert sorted(p.name for p in folder.iterdir()) == ["best.pt", "latest.pt"]  # no .tmp
    assert ck.load_checkpoint(folder / "latest.pt")["frames"] == 1
    assert logger.best_score == 1.0


def test_a_full_disk_while_copying_best_leaves_no_tmp(tmp_path, monkeypatch):
    src = tmp_path / "latest.pt"
    ck.save_checkpoint({"frames": 3}, src)
    monkeypatch.setattr(ck, "_os_write", full_disk_after(0))
    with pytest.raises(CheckpointError, match=r"best\.pt: No space left"):
        ck.copy_checkpoint(src, tmp_path / "best.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]


def test_load_names_a_missing_or_damaged_file(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        ck.load_checkpoint(tmp_path / "latest.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot load checkpoint"):
        ck.load_checkpoint(tmp_path / "bad.pt")


def test_rng_states_round_trip_through_a_weights_only_load(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    ck.save_checkpoint({"rng": ck.rng_state()}, tmp_path / "c.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    ck.set_rng_state(ck.load_checkpoint(tmp_path / "c.pt")["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1]) and random.random() == expected[2]


def test_build_model_from_a_recorded_constructor_and_unknown_classes():
    spec = {"class": ck.object_path(torch.nn.Linear), "args": [3, 2], "kwargs": {"bias": False}}
    model = ck.build_model(spec)
    assert isinstance(model, torch.nn.Linear) and model.bias is None and model.in_features == 3
    with pytest.raises(CheckpointError, match="cannot import 'nowhere:Net'"):
        ck.build_model({"class": "nowhere:Net"})


def test_a_class_of_a_script_run_as_a_module_is_named_by_that_module(monkeypatch):
    # `python -m rlstruct.algos.dqn` defines its classes in __main__, which a later process (the
    # evaluate command) cannot import: the recorded path names the module it was run as.
    import sys
    import types

    from rlstruct.runs.checkpoint import import_object, object_path

    cls = type("QNetwork", (), {"__module__": "__main__"})
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name="rlstruct.algos.dqn")
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert object_path(cls) == "rlstruct.algos.dqn:QNetwork"
    assert import_object("rlstruct.algos.dqn:QNetwork").__name__ == "QNetwork"


# ----------------------------------------------------------------------------- a kill mid-write
class Killed(BaseException):
    """A SIGKILL at one instant of a checkpoint's writes: nothing after it runs."""


class Buffer:
    """A stand-in for a replay buffer: ``rows`` transitions, numbered."""

    def __init__(self, rows: int) -> None:
        self.rows = torch.arange(rows)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"rows": self.rows}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.rows = state["rows"]


def kill_at(step: int, monkeypatch) -> None:
    """Kills the process (raises Killed) at the ``step``-th file write or rename from now: every
    instant between two of them, and within a write, is one ``step``."""
    count = [0]

    def at(call):
        def wrapped(*args, **kwargs):
            count[0] += 1
            if count[0] == step:
                raise Killed
            return call(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(ck, "_os_write", at(ck._os_write))
    monkeypatch.setattr(ck.os, "replace", at(ck.os.replace))


def test_a_kill_at_any_instant_of_a_checkpoint_leaves_latest_and_the_buffer_a_pair(
    tmp_path, monkeypatch, capfd
):
    """Issue 38, item 4: buffer.pt was written before latest.pt, so a kill while latest.pt was
    written left the buffer one iteration ahead, and the resume dropped it whole. Whatever
    instant the kill strikes at, the resume finds latest.pt and the buffer of one iteration."""
    from rlstruct.runs.contents import CheckpointContents
    from rlstruct.runs.folder import RunFolder

    iterations = set()
    for step in range(1, 100):
        folder = RunFolder(tmp_path / f"run{step}")
        folder.path.mkdir()
        writer = ck.CheckpointWriter(folder)
        for it in (1, 2):  # whole checkpoints first: the pair of iteration 2 is on disk
            writer.save({"iteration": it}, float(it), {"buffer": Buffer(10 * it)}, it)
        kill_at(step, monkeypatch)
        try:
            writer.save({"iteration": 3}, 3.0, {"buffer": Buffer(30)}, 3)
            killed = False
        except Killed:
            killed = True
        monkeypatch.undo()
        latest = ck.load_checkpoint(folder.checkpoint("latest"))  # what a resume reads
        buffer = Buffer(0)
        CheckpointContents(latest, str(folder.path)).add_resume_files(folder, buffer=buffer)
        assert len(buffer.rows) == 10 * latest["iteration"], (step, latest["iteration"])
        assert "starts as built" not in capfd.readouterr().err, step
        iterations.add(latest["iteration"])
        if not killed:
            break
    assert iterations == {2, 3} and step > 4  # kills before and after latest.pt's rename

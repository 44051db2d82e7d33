"""Resume never damages a run and refuses what it cannot continue (issue 27, section 2): a refused
resume leaves the folder byte for byte, the config is compared with the checkpoint's own, one
session per folder (a killed holder does not block), another algorithm's folder is named, a
damaged checkpoint is a typed error without torch's ``weights_only=False`` advice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_run import config, train

from rlstruct.errors import CheckpointError, ConfigError
from rlstruct.runs.lock import LOCK_NAME, FolderLock
from rlstruct.runs.resolve import resolve


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (checkpoints included), by relative path."""
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_refused_resume_leaves_the_folder_byte_for_byte(tmp_path):
    first = train(config(tmp_path, target_return=None, max_frames=20))
    folder = first.logger.dir
    ckpt = folder / "checkpoints" / "latest.pt"
    state = torch.load(ckpt)
    state["model"]["bias"] = torch.zeros(3)  # a state that does not fit the model
    torch.save(state, ckpt)
    before = folder_bytes(folder)
    assert json.loads((folder / "summary.json").read_text())["status"] == "budget"
    with pytest.raises(CheckpointError, match="does not fit"):
        train(config(tmp_path, target_return=None, max_frames=40, resume=str(folder)))
    assert folder_bytes(folder) == before  # no "resumes" entry, summary still "budget"
    assert not (folder / LOCK_NAME).exists()


def test_resume_compares_with_the_config_the_checkpoint_records(tmp_path):
    first = train(config(tmp_path, target_return=None, max_frames=20, lr=0.001))
    folder = first.logger.dir
    meta = json.loads((folder / "config.json").read_text())
    meta["config"]["lr"] = 0.002  # a hand edit of config.json
    (folder / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"lr is 0\.002 here but 0\.001 in the checkpoint"):
        resolve(config(tmp_path, target_return=None, max_frames=40, lr=0.002,
                       resume=str(folder)), "test")


def test_another_algorithms_folder_is_named_with_the_command_that_resumes_it(tmp_path):
    from rlstruct.algos import ppo

    first = train(config(tmp_path, target_return=None, max_frames=20))
    with pytest.raises(ConfigError) as info:
        resolve(ppo.Config(resume=str(first.logger.dir)))
    message = str(info.value)
    assert f"{first.logger.dir} is a test run; resume it with" in message
    assert message.count("\n- ") == 1  # one line, not a field-by-field list


def test_a_second_session_on_a_folder_is_refused_naming_the_holder(tmp_path):
    first = train(config(tmp_path, target_return=None, max_frames=20))
    folder = first.logger.dir
    before = folder_bytes(folder)
    with FolderLock(folder), pytest.raises(ConfigError, match=rf"in use by pid {os.getpid()}"):
        train(config(tmp_path, target_return=None, max_frames=40, resume=str(folder)))
    after = folder_bytes(folder)
    after.pop(LOCK_NAME, None)
    assert after == before
    resumed = train(config(tmp_path, target_return=None, max_frames=40, resume=str(folder)))
    assert resumed.frames == 40


def test_a_lock_left_by_a_killed_session_does_not_block(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time
        from rlstruct.runs.lock import FolderLock
        lock = FolderLock({str(tmp_path)!r})
        print("locked", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=rf"pid {proc.pid}"):
            FolderLock(tmp_path)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
    assert (tmp_path / LOCK_NAME).exists()  # the file stays, the lock does not
    with FolderLock(tmp_path):
        pass


def test_a_damaged_checkpoint_is_a_typed_error_without_torchs_unsafe_advice(tmp_path):
    first = train(config(tmp_path, target_return=None, max_frames=20))
    (first.logger.dir / "checkpoints" / "latest.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ConfigError) as info:
        resolve(config(tmp_path, resume=str(first.logger.dir)), "test")
    message = str(info.value)
    assert "latest.pt" in message and "damaged or not a checkpoint" in message
    assert "weights_only" not in message and "arbitrary code" not in message


def test_resume_auto_continues_the_newest_checkpointed_run_and_passes_over_a_killed_one(tmp_path):
    """Issue 29: a Slurm job's first session killed (SIGKILL) before its first checkpoint left a
    run folder without ``checkpoints/latest.pt``, and every requeued session that resumed it
    exited 2. ``--resume auto`` starts fresh then, and continues the run once it has one."""
    killed = tmp_path / "runs" / "killed"
    killed.mkdir(parents=True)
    (killed / "config.json").write_text("{}")  # what a session killed at start leaves
    first = train(config(tmp_path, target_return=None, max_frames=20, resume="auto"))
    assert first.n_resumes == 0 and first.logger.dir != killed
    assert first.cfg.resume is None  # resolved: a fresh run
    again = train(config(tmp_path, target_return=None, max_frames=40, resume="auto"))
    assert again.n_resumes == 1 and again.logger.dir == first.logger.dir
    assert again.frames >= 40 and again.cfg.resume == str(first.logger.dir)


def test_an_explicit_resume_without_a_checkpoint_is_still_refused(tmp_path):
    killed = tmp_path / "runs" / "killed"
    killed.mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"holds no checkpoints/latest\.pt"):
        resolve(config(tmp_path, resume=str(killed)), "test")


def test_a_field_newer_than_the_checkpoint_resumes_at_its_default_only(tmp_path):
    """A run checkpointed before a config field existed (the checkpoint's config lacks it) had
    that field's default behaviour: it resumes with the default and is refused with another
    value (found resuming a Pong run across the release that added PPO's ``init``)."""
    first = train(config(tmp_path, target_return=None, max_frames=20))
    folder = first.logger.dir
    ckpt = folder / "checkpoints" / "latest.pt"
    state = torch.load(ckpt)
    assert state["config"]["gamma"] == 0.99
    del state["config"]["gamma"]  # as written by a release without the field
    torch.save(state, ckpt)
    resolve(config(tmp_path, target_return=None, max_frames=40, resume=str(folder)), "test")
    with pytest.raises(ConfigError, match=r"gamma is 0\.5 here but '<absent>' in the checkpoint"):
        resolve(config(tmp_path, target_return=None, max_frames=40, gamma=0.5,
                       resume=str(folder)), "test")


def test_an_algorithms_resumable_field_may_change_on_resume_and_its_other_fields_may_not(
        tmp_path):
    """SAC's ``concurrent_losses`` (``Config.resumable``: where the work runs) resumes with
    another value, and from a checkpoint written before the field existed (found resuming a
    Hopper run after the preset turned it on); its ``tau`` (what is learned) does not."""
    from rlstruct.algos import sac

    def cfg(**kw) -> sac.Config:
        return sac.Config(max_frames=64, learning_starts=32, batch_size=16, hidden=16,
                          eval_every=0, target_return=None, runs_dir=str(tmp_path), **kw)

    folder = Path(sac.main(cfg())["run_dir"])
    ckpt = folder / "checkpoints" / "latest.pt"
    state = torch.load(ckpt)
    del state["config"]["concurrent_losses"]  # as written by a release without the field
    torch.save(state, ckpt)
    assert resolve(cfg(resume=str(folder), concurrent_losses=True), "sac").concurrent_losses
    with pytest.raises(ConfigError, match=r"tau is 0\.5 here but 0\.01 in the checkpoint"):
        resolve(cfg(resume=str(folder), tau=0.5), "sac")

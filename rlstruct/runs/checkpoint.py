"""Checkpoint files: safe writes, loading, RNG states, and what rebuilds a model.

- :func:`save_checkpoint` serialises a state in memory, then writes it to ``PATH.tmp`` and
  renames it over ``PATH``: a crash, a kill or a full disk never leaves a truncated ``PATH``.
  A failed write removes the ``.tmp`` and raises :class:`~rlstruct.errors.CheckpointError`
  naming the file and the cause (``No space left on device``); the previous file is kept.
- :func:`load_checkpoint` reads one back (``weights_only``: tensors, numbers, strings, lists
  and dicts only).
- :func:`rng_state` / :func:`set_rng_state`: torch's, numpy's and Python's generators.
- :func:`object_path` / :func:`import_object` name a class by ``"pkg.mod:Qualname"``, and
  :func:`build_model` rebuilds a model from ``{"class", "args", "kwargs"}``, the constructor
  call a checkpoint records (see :meth:`rlstruct.runs.run.Run.model`).
- :func:`agent_spec` records the evaluation agent in a checkpoint; :func:`rebuild_agent` gives
  it back, its models rebuilt and loaded (what ``rlstruct evaluate`` and
  :func:`rlstruct.load_policy` play).
- :class:`CheckpointWriter` writes a run folder's ``checkpoints/``: ``latest.pt``, ``best.pt``
  by a score, and the resume files; :func:`load_states` loads a resumed checkpoint's states
  into a run's objects.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = Path(folder) / "latest.pt"
    ...     save_checkpoint({"frames": 256, "w": torch.ones(2)}, path)
    ...     print(load_checkpoint(path)["frames"], sorted(p.name for p in path.parent.iterdir()))
    256 ['latest.pt']
"""

from __future__ import annotations

import errno
import importlib
import io
import math
import os
import random
import secrets
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlstruct.dicttensor import DictTensor
from rlstruct.errors import CheckpointError
from rlstruct.runs.folder import RunFolder

#: The suffix of a resume file written for a ``latest.pt`` not yet renamed into place.
PENDING = ".new"

__all__ = [
    "save_checkpoint", "copy_checkpoint", "load_checkpoint", "rng_state", "set_rng_state",
    "object_path", "import_object", "build_model", "agent_spec", "rebuild_agent", "recorded_env",
    "PENDING", "save_resume_files", "commit_resume_files", "load_resume_files", "load_states",
    "load_state", "CheckpointWriter",
]


def save_checkpoint(state: Mapping[str, Any], path: str | Path) -> None:
    """Writes ``state`` (``torch.save``) to ``path`` atomically (see the module docstring).

    Raises:
        CheckpointError: the write failed (the message names ``path`` and the OS error); no
            ``.tmp`` is left and the previous ``path`` is untouched.
    """
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    _write_atomic(Path(path), buffer.getbuffer())


def copy_checkpoint(src: str | Path, dst: str | Path) -> None:
    """Copies the checkpoint ``src`` to ``dst`` atomically (``best.pt`` from ``latest.pt``).

    Raises:
        CheckpointError: reading ``src`` or writing ``dst`` failed.
    """
    try:
        data = Path(src).read_bytes()
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {src}: {_cause(err)}") from err
    _write_atomic(Path(dst), memoryview(data))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The state saved at ``path``, its tensors on ``map_location``.

    Raises:
        CheckpointError: no such file, or it cannot be read as a checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises several kinds; a CheckpointError
        # Never pass on torch's advice to load with weights_only=False: rlstruct does not
        # unpickle arbitrary objects, and a file that needs it is not one of its checkpoints.
        lines = [line.strip() for line in str(err).splitlines() if line.strip()
                 and "weights_only" not in line and "arbitrary code" not in line]
        reason = lines[-1][:200] if lines else type(err).__name__
        raise CheckpointError(
            f"cannot load checkpoint {path}: it is damaged or not a checkpoint rlstruct wrote "
            f"({type(err).__name__}: {reason})") from None


def rng_state() -> dict[str, Any]:
    """The states of torch's (CPU, and CUDA when initialised), numpy's and Python's global
    generators, in types a ``weights_only`` load accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": _listify(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restores what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"].cpu())
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def object_path(obj: Any) -> str:
    """``"pkg.mod:Qualname"`` of a class or function (what :func:`import_object` imports).
    An object of a script run as ``python -m pkg.mod`` lives in ``__main__``: it is named by the
    module the script was run as, which a later process can import."""
    module = obj.__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is not None and spec.name:
            module = spec.name
    return f"{module}:{obj.__qualname__}"


def import_object(path: str) -> Any:
    """The object named ``"pkg.mod:Qualname"`` (imports ``pkg.mod``).

    Raises:
        CheckpointError: the module does not import or has no such name.
    """
    module_name, _, qualname = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise CheckpointError(f"cannot import {path!r} recorded in the checkpoint: {err}") from err
    return obj


def build_model(spec: Mapping[str, Any]) -> torch.nn.Module:
    """``cls(*args, **kwargs)`` from a recorded constructor call ``{"class", "args", "kwargs"}``.

    Raises:
        CheckpointError: the class cannot be imported.
    """
    cls = import_object(spec["class"])
    return cls(*spec.get("args", ()), **spec.get("kwargs", {}))


def agent_spec(
    create_agent: Any, agent_args: Mapping[str, Any], agent_info: Any,
    saved: Mapping[str, Any],
) -> dict[str, Any] | None:
    """The evaluation agent as a checkpoint records it: ``{"class", "args", "agent_info"}``,
    an argument that is one of the ``saved`` objects by its name (``{"saved": name}``), plain
    values as they are; ``None`` when an argument is neither (it cannot be recorded).
    """
    args: dict[str, Any] = {}
    for key, value in agent_args.items():
        names = [name for name, obj in saved.items() if obj is value]
        if names:
            args[key] = {"saved": names[0]}
        elif value is None or isinstance(value, (bool, int, float, str)):
            args[key] = value
        else:
            return None  # an argument the checkpoint cannot hold: evaluate will say so
    info = None if agent_info is None else dict(agent_info.items())
    try:
        path = object_path(create_agent)
    except AttributeError:
        return None
    return {"class": path, "args": args, "agent_info": info}


def rebuild_agent(
    state: Mapping[str, Any], path: str | Path,
) -> tuple[Callable[..., Any], dict[str, Any], DictTensor | None]:
    """The evaluation agent that :func:`agent_spec` recorded in the checkpoint ``state``:
    ``(create_agent, agent_args, agent_info)``, each saved model of ``agent_args`` rebuilt on
    the CPU from its recorded constructor call and loaded with its weights; ``agent_info``
    (``(1, ...)``, the greedy one) as a DictTensor, or None.

    Args:
        state: a checkpoint, as :func:`load_checkpoint` returns it.
        path: the checkpoint's file (for messages).

    Raises:
        CheckpointError: the checkpoint does not record the agent (written before rlstruct
            recorded it, or an agent argument it cannot hold), or holds a model's weights but
            not its constructor call, or a recorded class cannot be imported.
    """
    spec = state.get("agent")
    if spec is None:
        raise CheckpointError(f"{path} does not record the evaluation agent (written before "
                              "rlstruct recorded it, or an agent argument it cannot hold)")
    constructors = state.get("constructors", {})
    args: dict[str, Any] = {}
    for key, value in spec["args"].items():
        if isinstance(value, dict) and "saved" in value:
            name = value["saved"]
            if name not in constructors:
                raise CheckpointError(
                    f"{path} holds {name!r}'s weights but not its constructor arguments: build "
                    f"it with run.model(cls, *args) in the algorithm so checkpoints record them")
            model = build_model(constructors[name])
            model.load_state_dict(state[name])
            args[key] = model
        else:
            args[key] = value
    info = spec.get("agent_info")
    agent_info = None if info is None else DictTensor({k: torch.as_tensor(v)
                                                       for k, v in info.items()})
    return import_object(spec["class"]), args, agent_info


def recorded_env(state: Mapping[str, Any], path: str | Path) -> tuple[str, str, list[str]]:
    """The env a checkpoint's run trained on: ``(env_id, env_backend, env_module)`` from the
    config it records (``gymnasium`` and no module where it names none).

    Raises:
        CheckpointError: the checkpoint records no config, or a config without a string
            ``env_id`` (not written by a run of rlstruct, or edited).
    """
    cfg = state.get("config")
    env_id = cfg.get("env_id") if isinstance(cfg, Mapping) else None
    if not isinstance(env_id, str) or not env_id:
        what = "no config" if not isinstance(cfg, Mapping) else f"env_id {env_id!r}"
        raise CheckpointError(
            f"{path} records {what}: a run's checkpoint holds its whole config, env_id "
            "included, to rebuild the env it trained on (was this file written by rlstruct "
            "train, or edited?)")
    modules = cfg.get("env_module") or []
    return env_id, str(cfg.get("env_backend") or "gymnasium"), list(modules)


def save_resume_files(folder: RunFolder, objects: Mapping[str, Any], iteration: int,
                      token: str = "") -> None:
    """Saves each object's state to ``checkpoints/<name>.new.pt``, tagged with ``iteration``
    and ``token`` (that of the ``latest.pt`` written next): the states only a resume needs
    (:meth:`~rlstruct.runs.run.Run.resume_state`). :func:`commit_resume_files` renames them
    to ``<name>.pt`` once ``latest.pt`` is written; until then ``<name>.pt`` still holds the
    previous checkpoint's, so a kill at any instant leaves a pair that :func:`load_resume_files`
    finds (see :class:`CheckpointWriter`).

    Raises:
        CheckpointError: a write failed (the previous file is kept).
    """
    for name, obj in objects.items():
        state = {"iteration": iteration, "token": token, "state": _own_storage(obj.state_dict())}
        save_checkpoint(state, folder.checkpoint(f"{name}{PENDING}"))


def commit_resume_files(folder: RunFolder, names: Iterable[str]) -> None:
    """Renames each ``checkpoints/<name>.new.pt`` over ``<name>.pt`` (after ``latest.pt``).

    Raises:
        CheckpointError: a rename failed.
    """
    for name in names:
        path = folder.checkpoint(name)
        try:
            os.replace(folder.checkpoint(f"{name}{PENDING}"), path)
        except OSError as err:
            raise CheckpointError(f"cannot write checkpoint {path}: {_cause(err)}") from err


def load_resume_files(folder: RunFolder, objects: Mapping[str, Any],
                      iteration: int | None, token: str | None = None) -> None:
    """Loads into each object the ``checkpoints/<name>.pt`` (or the ``<name>.new.pt`` of a
    checkpoint cut short after ``latest.pt``) saved with ``latest.pt``: the one tagged with its
    ``token`` (checkpoints written before tokens: with its ``iteration``). No such file leaves
    the object as built (an empty replay buffer) and says so on stderr.

    Raises:
        CheckpointError: the file is damaged, or its state does not load into the object.
    """
    for name, obj in objects.items():
        path, found = folder.checkpoint(name), None
        for candidate in (folder.checkpoint(f"{name}{PENDING}"), path):  # the newer first
            saved = load_checkpoint(candidate) if candidate.is_file() else {}
            if _saved_with(saved, iteration, token):
                found = saved
                break
        if found is None:  # ``saved``: what <name>.pt holds
            what = f"is of iteration {saved.get('iteration')}" if saved else "is absent"
            print(f"rlstruct: resume: {path} {what}, not {iteration} (latest.pt's): {name} "
                  "starts as built", file=sys.stderr)
            continue
        try:
            obj.load_state_dict(found["state"])
        except (ValueError, RuntimeError, KeyError) as err:  # ShapeError, KeyMismatchError too
            raise CheckpointError(f"resume: the state in {path} does not fit this run's "
                                  f"{type(obj).__name__}: {err}") from err


def _saved_with(saved: Mapping[str, Any], iteration: int | None, token: str | None) -> bool:
    """Whether a resume file's contents were saved with the ``latest.pt`` of ``token``."""
    if not saved:
        return False
    return saved.get("token") == token if token else saved.get("iteration") == iteration


def load_states(state: Mapping[str, Any], objects: Mapping[str, Any], source: Any) -> None:
    """Loads ``state[name]`` into each object (``obj.load_state_dict``), then the RNG states
    (``state["rng"]``): a resumed run's model, optimizer and generators.

    Args:
        state: the checkpoint being resumed.
        objects: ``name -> object`` (what the run's checkpoints hold).
        source: the run folder resumed (for messages).

    Raises:
        CheckpointError: ``state`` holds no state for one of them, or a state that does not
            load into it.
    """
    for name, obj in objects.items():
        load_state(state, name, obj, source)
    set_rng_state(state["rng"])


def load_state(state: Mapping[str, Any], name: str, obj: Any, source: Any) -> None:
    """Loads ``state[name]`` into ``obj`` (``obj.load_state_dict``), the RNG states left alone.

    Raises:
        CheckpointError: ``state`` holds no ``name``, or a state that does not load into it.
    """
    if name not in state:
        raise CheckpointError(f"resume: {source} has no state for {name!r} "
                              f"(it holds {sorted(state)})")
    try:
        obj.load_state_dict(state[name])
    except (ValueError, RuntimeError, KeyError) as err:  # torch's words for "not this"
        raise CheckpointError(
            f"resume: the state of {name!r} in {source} does not fit this run's "
            f"{type(obj).__name__} (a checkpoint of another model or optimizer layout, "
            f"or of an earlier rlstruct version): {err}") from err


class CheckpointWriter:
    """Writes the checkpoints of a run folder: ``checkpoints/latest.pt``, ``best.pt`` when the
    score is the best so far, and the resume files (``checkpoints/<name>.pt``).

    Every write goes through a temporary file and an atomic rename (:func:`save_checkpoint`),
    so an interrupt or a full disk never leaves a truncated checkpoint nor a ``.tmp``. The
    resume files and ``latest.pt`` form a pair whatever instant a kill (SIGKILL, an OOM kill, a
    lost node) strikes at: each resume file is written as ``<name>.new.pt`` first, tagged with a
    token that ``latest.pt`` (written next) records as ``resume_token``, and only then renamed
    to ``<name>.pt``. Before ``latest.pt`` is in place the previous pair is whole; after it,
    :func:`load_resume_files` finds the new one under either name. While a checkpoint is
    written the disk holds two copies of each resume file (a replay buffer).

    Args:
        folder: the run folder.
        best_score: the best score so far (a resumed run's), or None.

    Attributes:
        best_score: the best checkpoint score so far (``None`` before the first).
    """

    def __init__(self, folder: RunFolder, best_score: float | None = None) -> None:
        self.folder, self.best_score = folder, best_score

    def save(self, state: Mapping[str, Any], score: float | None = None,
             resume_files: Mapping[str, Any] | None = None, iteration: int = 0) -> None:
        """Saves ``state`` to ``latest.pt``, and to ``best.pt`` when ``score`` is best (a
        ``None`` or nan score never counts as best, a tie is no improvement).

        Args:
            state: the checkpoint.
            score: its score (the training return).
            resume_files: ``name -> object`` whose states only a resume needs, saved first
                (:func:`save_resume_files`, tagged with ``iteration`` and the token that
                ``latest.pt`` then records) and renamed into place after ``latest.pt``.
            iteration: the iteration of the checkpoint.

        Raises:
            CheckpointError: a write failed (the file and the cause are named; the previous
                checkpoint is kept).
        """
        self.folder.make_checkpoints()
        if resume_files:
            token = secrets.token_hex(8)
            save_resume_files(self.folder, resume_files, iteration, token)
            state = {**state, "resume_token": token}
        latest = self.folder.checkpoint("latest")
        save_checkpoint(state, latest)
        if resume_files:
            commit_resume_files(self.folder, resume_files)
        if score is None:
            return
        score = float(score)
        if math.isnan(score) or (self.best_score is not None and score <= self.best_score):
            return
        copy_checkpoint(latest, self.folder.checkpoint("best"))
        self.best_score = score

    def remove_partial(self) -> None:
        """Removes half-written checkpoints (``*.tmp``): before a process ends at once."""
        for tmp in self.folder.checkpoints.glob("*.tmp"):
            tmp.unlink(missing_ok=True)


def _own_storage(state: Any) -> Any:
    """``state`` with each tensor view of a larger storage cloned: ``torch.save`` writes a
    view's whole storage (a replay buffer's filled rows would cost its full capacity)."""
    if isinstance(state, torch.Tensor):
        return state.clone() if state.untyped_storage().nbytes() > state.nbytes else state
    if isinstance(state, dict):
        return {k: _own_storage(v) for k, v in state.items()}
    return state


def _write_atomic(path: Path, data: memoryview) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            written = 0
            while written < len(data):
                written += _os_write(fd, data[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        kept = f"; the last good checkpoint {path} is kept" if path.exists() else ""
        raise CheckpointError(f"cannot write checkpoint {path}: {_cause(err)}{kept}") from err


_os_write = os.write  # the one write call (tests inject a full disk here)


def _cause(err: OSError) -> str:
    name = errno.errorcode.get(err.errno or 0, "")
    return f"{err.strerror or err} ({name})" if name else str(err)


def _listify(value: Any) -> Any:
    return [_listify(v) for v in value] if isinstance(value, tuple) else value

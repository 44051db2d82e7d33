"""What a run's checkpoints hold: :class:`CheckpointContents`, the registry behind
:meth:`Run.model <rlstruct.runs.run.Run.model>`,
:meth:`~rlstruct.runs.run.Run.checkpoint_state` and :meth:`~rlstruct.runs.run.Run.resume_state`.

Each object registered is saved by its ``state_dict()``; each model built through
:meth:`CheckpointContents.model` has its constructor call recorded (``constructors``), and the
evaluation agent its class and arguments (``agent``), so that ``rlstruct evaluate`` and
:func:`rlstruct.load_policy` rebuild the policy without the algorithm's code. On ``--resume``
each object is loaded from the resumed checkpoint as it is registered.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rlstruct.dicttensor import DictTensor
from rlstruct.runs import checkpoint as ckpt
from rlstruct.runs.folder import RunFolder

__all__ = ["CheckpointContents"]


class CheckpointContents:
    """The objects a run's checkpoints hold (see the module notes).

    Args:
        resumed: the checkpoint being resumed (``{}``: a fresh run).
        source: the run folder resumed (for messages).

    Attributes:
        eval_agent: ``(create_agent, agent_args, agent_info)`` of the evaluation agent, or None.
        resume_files: ``name -> object`` saved to ``checkpoints/<name>.pt`` (resume only).
    """

    def __init__(self, resumed: Mapping[str, Any], source: str | None) -> None:
        self._resumed, self._source = resumed, source
        self._saved: dict[str, Any] = {}
        # name -> the module a saved object stands for (a learner group for the model it
        # replicates): how the checkpoint's constructors and evaluation agent find it.
        self._stands_for: dict[str, Any] = {}
        self._constructors: list[tuple[Any, dict[str, Any]]] = []
        self.eval_agent: tuple[Any, dict[str, Any], DictTensor | None] | None = None
        self.resume_files: dict[str, Any] = {}

    def model(self, cls: Callable[..., torch.nn.Module], *args: Any, **kwargs: Any) -> Any:
        """``cls(*args, **kwargs)``, its call recorded (``cls`` may be a ``functools.partial``
        of such a call; the arguments must be plain values)."""
        if isinstance(cls, functools.partial):  # a factory that the learner ranks also use
            args, kwargs, cls = (*cls.args, *args), {**cls.keywords, **kwargs}, cls.func
        module = cls(*args, **kwargs)
        self._constructors.append(
            (module, {"class": ckpt.object_path(cls), "args": list(args), "kwargs": dict(kwargs)}))
        return module

    def add(self, **objects: Any) -> None:
        """Registers ``name -> object``; on a resume, loads their states and the RNG states.

        Raises:
            CheckpointError: the resumed checkpoint holds no state for one of them, or a state
                that does not load into it.
        """
        self._saved.update(objects)
        if self._resumed:
            ckpt.load_states(self._resumed, objects, self._source)

    def load_agent_models(self, agent_args: Mapping[str, Any]) -> None:
        """On a resume, loads the resumed checkpoint's weights into each model of
        ``agent_args`` that it holds (by the name its recorded agent gives the argument, else by
        the argument's own name), before a batcher copies them: the first segment after a
        resume is collected with the checkpoint's policy, not with the freshly built one.

        Raises:
            CheckpointError: a saved state does not load into its model.
        """
        if not self._resumed:
            return
        recorded = (self._resumed.get("agent") or {}).get("args") or {}
        for key, value in agent_args.items():
            saved = recorded.get(key)
            name = saved["saved"] if isinstance(saved, Mapping) and "saved" in saved else key
            if isinstance(value, torch.nn.Module) and isinstance(self._resumed.get(name), Mapping):
                ckpt.load_state(self._resumed, name, value, self._source)

    def add_resume_files(self, folder: RunFolder, **objects: Any) -> None:
        """Registers ``name -> object`` saved to ``checkpoints/<name>.pt`` of the run folder; on
        a resume, loads them
        (:func:`~rlstruct.runs.checkpoint.load_resume_files`).

        Raises:
            CheckpointError: a saved state does not load into its object.
        """
        self.resume_files.update(objects)
        if self._resumed:
            ckpt.load_resume_files(folder, objects, self._resumed.get("iteration"),
                                   self._resumed.get("resume_token"))

    def stand_for(self, name: str, module: torch.nn.Module) -> None:
        """The saved object ``name`` (a learner group) holds the weights of ``module``."""
        self._stands_for[name] = module

    def state(self) -> dict[str, Any]:
        """Each object's ``state_dict()`` by name, with ``constructors`` (the recorded calls of
        the saved models) and ``agent`` (:func:`~rlstruct.runs.checkpoint.agent_spec`)."""
        state = {name: obj.state_dict() for name, obj in self._saved.items()}
        modules = {name: self._stands_for.get(name, obj) for name, obj in self._saved.items()}
        state["constructors"] = {name: spec for name, obj in modules.items()
                                 for built, spec in self._constructors if obj is built}
        state["agent"] = (None if self.eval_agent is None
                          else ckpt.agent_spec(*self.eval_agent, modules))
        return state

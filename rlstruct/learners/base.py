"""What every learner group shares: the arguments and their checks, the driver's calls built on
``submit``/``collect``, and how checkpoints see the group's model and optimizer.

:class:`~rlstruct.learners.group.LearnerGroup` (ranks as processes of this node),
:class:`~rlstruct.learners.ray_group.RayLearnerGroup` (ranks as Ray actors) and
:class:`~rlstruct.learners.torchrun.TorchrunLearnerGroup` (rank 0 of a torchrun world) derive
from :class:`LearnerGroupBase`: each one starts its ranks and implements ``submit``,
``collect``, ``optimizer_state_dict``, ``close``, the weights after the last batch
(``_weights``) and the load of a state on every rank (``_load``); the base gives them
``learn``, ``state_dict``, ``load_state_dict``, ``load_optimizer_state_dict``, ``optimizer``
and the context manager.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

from rlstruct.blocks.optim import Optimizer
from rlstruct.errors import BatcherStateError, ConfigError
from rlstruct.parallel.weights import WeightSpecs

__all__ = ["LearnerGroupBase", "RankZeroOptimizer", "GroupPart", "under", "ModelFactory",
           "OptimizerFactory", "LearnFn"]

#: ``make_model()``: builds a rank's replica (after ``torch.manual_seed``).
ModelFactory = Callable[[], nn.Module]
#: ``make_optimizer(params, device=device)``, e.g. ``partial(rlstruct.blocks.optim.adam, lr=1e-3)``.
OptimizerFactory = Callable[..., Optimizer]
#: ``learn(ctx, shard, **kwargs) -> Mapping[str, float] | None`` on each rank.
LearnFn = Callable[..., Mapping[str, float] | None]


def under(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries of ``state`` whose key starts with ``prefix``, without it (the same tensors;
    ``state`` itself for ``""``).

    Example:
        >>> under({"actor.w": 1, "critic.w": 2}, "actor.")
        {'w': 1}
    """
    if not prefix:
        return state
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


class LearnerGroupBase:
    """The shared part of the learner groups (see the module notes).

    The arguments of :meth:`_setup`, which every group's constructor calls:

    Args:
        make_model, make_optimizer, learn: the factories and the learn function (callables).
        init_state: the initial weights (a non-empty state_dict); it fixes the keys, shapes and
            dtypes :meth:`load_state_dict` accepts.
        timeout, start_timeout, bucket_mb: finite numbers > 0.
    """

    n_learners: int
    timeout: float

    def _setup(
        self, name: str, problems: list[str], make_model: ModelFactory,
        make_optimizer: OptimizerFactory, learn: LearnFn, init_state: Mapping[str, Tensor],
        timeout: float, start_timeout: float, bucket_mb: float,
    ) -> None:
        """Checks the shared arguments, then raises one ConfigError listing ``problems`` (the
        group's own) and theirs; stores them."""
        problems = [f"{n} must be callable, got {type(fn).__name__}"
                    for n, fn in (("make_model", make_model), ("make_optimizer", make_optimizer),
                                  ("learn", learn)) if not callable(fn)] + problems
        for n, value in (("timeout", timeout), ("start_timeout", start_timeout),
                         ("bucket_mb", bucket_mb)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                problems.append(f"{n} must be a finite number > 0, got {value!r}")
        if not (isinstance(init_state, Mapping) and init_state
                and all(isinstance(v, Tensor) for v in init_state.values())):
            problems.append("init_state must be a non-empty state_dict (str -> Tensor)")
        if problems:
            raise ConfigError(f"{name}: " + "; ".join(problems))
        self.timeout, self.start_timeout = float(timeout), float(start_timeout)
        self.bucket_bytes = max(1, int(bucket_mb * 2**20))
        self._weight_specs = WeightSpecs(init_state, f"{name}.load_state_dict",
                                         "the state_dict", "init_state")

    # ------------------------------------------------------------------ what a group implements
    def submit(self, batch: Any, **kwargs: Any) -> None:
        """Sends each rank its rows of ``batch`` (see the group)."""
        raise NotImplementedError

    def collect(self, timeout: float | None = None) -> dict[str, float]:
        """The metrics of the oldest submitted batch (see the group)."""
        raise NotImplementedError

    def optimizer_state_dict(self) -> dict[str, Any]:
        """Rank 0's optimizer state (see the group)."""
        raise NotImplementedError

    def close(self, timeout: float = 10.0) -> None:
        """Ends every rank (see the group)."""
        raise NotImplementedError

    def _weights(self) -> dict[str, Tensor]:
        raise NotImplementedError

    def _load(self, state: Mapping[str, Tensor] | None, optimizer_state: dict | None) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ shared calls
    def learn(self, batch: Any, **kwargs: Any) -> dict[str, float]:
        """:meth:`submit` then :meth:`collect`."""
        self.submit(batch, **kwargs)
        return self.collect()

    def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """Rank 0's weights after the last collected batch (the initial ones before), CPU
        tensors; valid until the next batch (``batcher.update`` copies them; clone them to keep
        them longer).

        Args:
            prefix: only the keys that start with it, without it (e.g. ``"actor."``: the
                weights of the submodule the workers run); ``""``: every key.
        """
        return under(self._weights(), prefix)

    def load_state_dict(self, state_dict: Mapping[str, Tensor]) -> None:
        """Loads ``state_dict`` (e.g. a checkpoint's model, on a resume) into every rank's
        replica, so the replicas stay identical; :meth:`state_dict` returns it until the next
        batch. Call it with nothing in flight.

        Raises:
            KeyMismatchError, ShapeError: other keys, shapes or dtypes than ``init_state``'s.
            BatcherStateError: batches are in flight, or the group is closed.
            LearnerError, LearnerTimeoutError: a rank failed, or did not load it in time.
        """
        self._weight_specs.check(state_dict)
        self._load(state_dict, None)

    def load_optimizer_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Loads an optimizer state (e.g. a checkpoint's) into every rank's optimizer. Call it
        with nothing in flight.

        Raises:
            BatcherStateError: batches are in flight, or the group is closed.
            LearnerError, LearnerTimeoutError: a rank failed (e.g. the state does not fit its
                optimizer), or did not load it in time.
        """
        self._load(None, dict(state_dict))

    @property
    def optimizer(self) -> RankZeroOptimizer:
        """The group's optimizer as checkpoints see it (``state_dict``: rank 0's;
        ``load_state_dict``: on every rank), for
        ``run.checkpoint_state(optimizer=group.optimizer)``."""
        return RankZeroOptimizer(self)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RankZeroOptimizer:
    """A learner group's optimizer as checkpoints see it: ``state_dict()`` fetches rank 0's
    (identical on every rank), ``load_state_dict(state)`` loads ``state`` on every rank.

    Args:
        group: the learner group (held by a weak reference).
    """

    def __init__(self, group: LearnerGroupBase) -> None:
        self._group = weakref.ref(group)

    def _get(self) -> LearnerGroupBase:
        group = self._group()
        if group is None:
            raise BatcherStateError("the learner group of this optimizer is gone")
        return group

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's optimizer state."""
        return self._get().optimizer_state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Loads ``state_dict`` into every rank's optimizer."""
        self._get().load_optimizer_state_dict(state_dict)


class GroupPart:
    """The weights of one submodule of a learner group's model, as checkpoints see them (SAC's
    actor inside its learner nets: what the workers and the evaluation run).

    Args:
        group: the learner group.
        prefix: the submodule's prefix in the group's state_dict (``"actor."``).
    """

    def __init__(self, group: LearnerGroupBase, prefix: str) -> None:
        self._group, self._prefix = group, prefix

    def state_dict(self) -> dict[str, Tensor]:
        """The submodule's weights (rank 0's)."""
        return dict(self._group.state_dict(self._prefix))

    def load_state_dict(self, state_dict: Mapping[str, Tensor]) -> None:
        """Loads the submodule's weights on every rank; the rest of the model keeps its own."""
        full = dict(self._group.state_dict())
        full.update({self._prefix + k: v for k, v in state_dict.items()})
        self._group.load_state_dict(full)

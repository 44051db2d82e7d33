"""Model weights shared with the workers: a ring of versioned copies in shared memory.

``Batcher.update(state_dict)`` writes the tensors into one slot of the ring (one ``copy_`` per
tensor, no pickling, no per-worker copy) and returns; a worker loads a given version from its
slot at the start of a segment, never in the middle of one. The ring is allocated once, at the
first update, from that state_dict's keys, shapes and dtypes; a later state_dict must match
(:class:`WeightSpecs`, checked by the batcher before it writes).

Slot ``v % n_slots`` holds version ``v``. Each slot carries a tag: the version it holds, or -1
while it is being written. The batcher never overwrites a slot that a released, unfinished
segment still has to load, so a reader always finds its version there; readers check the tag
before and after copying anyway (a violated invariant is an internal error, never torn weights).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from rlstruct.errors import KeyMismatchError, NonFiniteError, ShapeError

__all__ = ["SharedWeights", "WeightSpecs", "is_state_dict", "check_finite"]


def is_state_dict(info: Any) -> bool:
    """True for a non-empty mapping of ``str`` keys to tensors (what the ring carries)."""
    return (
        isinstance(info, Mapping)
        and len(info) > 0
        and all(isinstance(k, str) and isinstance(v, Tensor) for k, v in info.items())
    )


def check_finite(state_dict: Mapping[str, Tensor]) -> None:
    """Raises unless every floating-point tensor of ``state_dict`` is finite.

    Fast path: one sum per tensor (a single pass, no temporary the size of the weights; NaN and
    infinities propagate into it) and one host sync per device. Only when a sum is not finite
    are those tensors checked element by element (a sum can also overflow), which names the
    keys.

    Raises:
        NonFiniteError: naming every key that holds NaN or an infinity.
    """
    by_device: dict[torch.device, list[tuple[str, Tensor]]] = {}
    for k, v in state_dict.items():
        if (v.is_floating_point() or v.is_complex()) and v.numel():
            by_device.setdefault(v.device, []).append((k, v))
    bad: list[str] = []
    for items in by_device.values():
        sums = torch.stack([v.detach().sum() for _k, v in items])
        if bool(torch.isfinite(sums).all()):
            continue
        for (k, v), total in zip(items, sums.tolist()):
            if not torch.isfinite(torch.tensor(total)) and not bool(torch.isfinite(v).all()):
                bad.append(k)
    if bad:
        raise NonFiniteError(
            f"update(): NaN or an infinity in the state_dict at key(s) {bad}; the workers would "
            "act with a broken model (check the loss and the learning rate; "
            "update(..., check_finite=False) skips this check)"
        )


class WeightSpecs:
    """The keys, shapes and dtypes of a first mapping of tensors (a batcher's first state_dict,
    a learner group's first batch shard); every later one must match (the copies in shared
    memory were allocated from it).

    Args:
        example: the first mapping (any device).
        where: who checks, the start of every message (``"update()"``).
        what: what is checked (``"the state_dict"``); a key's tensor is ``what[key]``.
        first: what the specs came from (``"the first update"``).
        hint: appended to every message (e.g. why the shapes are fixed).
    """

    def __init__(
        self, example: Mapping[str, Tensor], where: str = "update()",
        what: str = "the state_dict", first: str = "the first update", hint: str = "",
    ) -> None:
        self.specs = {k: (tuple(v.shape), v.dtype) for k, v in example.items()}
        self._where, self._what, self._first, self._hint = where, what, first, hint

    def check(self, tensors: Mapping[str, Tensor]) -> None:
        """Raises unless ``tensors`` has exactly the first one's keys, shapes and dtypes.

        Raises:
            KeyMismatchError: a missing or extra key (named).
            ShapeError: a key with another shape or dtype (named, with both).
        """
        missing = [k for k in self.specs if k not in tensors]
        extra = [k for k in tensors if k not in self.specs]
        if missing or extra:
            raise KeyMismatchError(
                f"{self._where}: {self._what} has other keys than {self._first}: missing "
                f"{missing}, unexpected {extra}{self._hint}"
            )
        for k, v in tensors.items():
            shape, dtype = self.specs[k]
            if tuple(v.shape) != shape or v.dtype != dtype:
                raise ShapeError(
                    f"{self._where}: {self._what}[{k!r}] is {tuple(v.shape)} {v.dtype}, but "
                    f"{self._first} had {shape} {dtype}{self._hint}"
                )


class SharedWeights(WeightSpecs):
    """``n_slots`` CPU copies of a state_dict in shared memory, with version tags.

    Args:
        example: the first state_dict (any device); fixes keys, shapes and dtypes.
        n_slots: ring size (>= 2).
    """

    def __init__(self, example: Mapping[str, Tensor], n_slots: int) -> None:
        assert n_slots >= 2, n_slots
        super().__init__(example)
        self.keys = list(example)
        self.slots = [
            {
                k: torch.empty(shape, dtype=dtype).share_memory_()
                for k, (shape, dtype) in self.specs.items()
            }
            for _ in range(n_slots)
        ]
        self.tags = torch.full((n_slots,), -1, dtype=torch.long).share_memory_()

    @property
    def n_slots(self) -> int:
        """The ring size."""
        return len(self.slots)

    def nbytes(self) -> int:
        """Bytes of one slot."""
        return sum(t.numel() * t.element_size() for t in self.slots[0].values())

    def reserve(self, version: int) -> dict[str, Tensor]:
        """The slot of ``version``, tagged as being written (no reader takes it): a writer (the
        batcher, or a learner rank in another process) fills it, then :meth:`commit`."""
        slot = version % self.n_slots
        self.tags[slot] = -1
        return self.slots[slot]

    def commit(self, version: int) -> None:
        """Tags the slot of ``version`` (filled since :meth:`reserve`) as holding it."""
        self.tags[version % self.n_slots] = version

    def is_slot(self, version: int, tensors: Mapping[str, Tensor]) -> bool:
        """True when ``tensors`` is the very slot of ``version`` (filled in place)."""
        return tensors is self.slots[version % self.n_slots]

    def write(self, version: int, state_dict: Mapping[str, Tensor]) -> None:
        """Copies ``state_dict`` (checked, any device) into the slot of ``version``."""
        dst = self.reserve(version)
        torch._foreach_copy_([dst[k] for k in self.keys], [state_dict[k] for k in self.keys])
        self.commit(version)

    def staging(self) -> dict[str, Tensor]:
        """A worker-local copy of one slot's tensors, to load versions into."""
        return {k: t.clone() for k, t in self.slots[0].items()}

    def read_into(self, version: int, staging: Mapping[str, Tensor]) -> None:
        """Copies version ``version`` into ``staging`` (from :meth:`staging`)."""
        slot = version % self.n_slots
        src = self.slots[slot]
        if int(self.tags[slot]) != version:
            raise RuntimeError(f"weights version {version} is not in its slot (internal error)")
        torch._foreach_copy_([staging[k] for k in self.keys], [src[k] for k in self.keys])
        if int(self.tags[slot]) != version:
            raise RuntimeError(f"weights version {version} was overwritten while read (internal)")

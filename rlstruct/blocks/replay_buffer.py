"""``ReplayBuffer``: a circular buffer of transitions for off-policy algorithms (DQN).

Invariant:
    the storage is one tensor ``(capacity, *feat)`` per stored key, all on ``device``, allocated
    once (at the first ``add``, from the specs of that batch) and never grown or reallocated.
    Rows ``[0, len(self))`` hold transitions; once the buffer is full, row ``position`` holds the
    oldest one and the next ``add`` overwrites from there. Every ``add`` and ``load_state_dict``
    is checked against the stored keys, feature shapes and dtypes before anything is written, so
    a rejected batch leaves the buffer as it was.

A transition is one VALID step of a trajectory row (padding steps ``t >= lengths[b]`` are never
stored): ``observation/*`` (what the agent saw), ``action/*`` (what it returned) and
``_observation/*`` (the env's answer: next observation, ``reward``, ``terminated``, ``truncated``;
at an episode end the TRUE final observation), so a sampled row carries ``(s, a, r, s', flags)``.
Only trajectory keys are stored; the per-row ``info`` of :class:`~rlstruct.Trajectories`
(``agent_info/*``, ``env_info/*``, ``agent_state/*``, ``env_id``, ``policy_version``) is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rlstruct.blocks.replay_config import (
    ReplayCheckpoint,
    buffer_device,
    buffer_generator,
    buffer_keys,
)
from rlstruct.blocks.replay_config import replay_memory_problems as replay_memory_problems
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.errors import (
    ConfigError,
    KeyMismatchError,
    ShapeError,
)
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories

__all__ = ["ReplayBuffer", "ReplayCheckpoint"]

_Spec = tuple[torch.Size, torch.dtype]


class ReplayBuffer:
    """A fixed-capacity circular buffer of transitions, stored and sampled on one device.

    ``add`` takes the valid steps of a batch of trajectories (``sum(lengths)`` transitions, row by
    row, in time order) and writes them after the newest stored one, overwriting the oldest once
    the buffer is full; ``sample`` draws transitions uniformly with replacement from the filled
    part. Storage is ``(capacity, *feat)`` per key on ``device``, allocated at the first ``add``
    from that batch's specs and never grown; later batches must have the same keys, feature
    shapes and dtypes (nothing is ever cast).

    Args:
        capacity: the maximum number of transitions kept (> 0).
        device: where the storage lives and samples are returned (``"cpu"``, ``"cuda:1"``,
            ``"meta"``...). Batches on any device are copied there.
        keys: the trajectory keys to store, full names such as ``"observation/frame"``,
            ``"action/action"``, ``"_observation/reward"``; ``None`` stores every key of the
            first batch. Info keys (``agent_info/*``, ``env_id``, ...) and ``lengths`` cannot be
            stored.
        generator: a ``torch.Generator`` ON ``device`` for ``sample``; ``None`` creates one there
            at the first ``sample``, seeded once from torch's global (CPU) RNG, so
            ``torch.manual_seed`` makes sampling reproducible. On ``"meta"`` (no data, no
            generator) the generator is unused.

    Raises:
        ConfigError: ``capacity`` is not a positive int, ``device`` cannot be used, or ``keys``
            is a str, empty, repeats a key or names an info key or ``lengths``.
        DeviceContractError: ``generator`` lives on another device than ``device``.

    Examples:
        >>> steps = {
        ...     "observation/frame": torch.arange(6).reshape(2, 3, 1),
        ...     "action/action": torch.zeros(2, 3, dtype=torch.long),
        ...     "_observation/reward": torch.ones(2, 3),
        ... }
        >>> tdt = TemporalDictTensor(steps, torch.tensor([3, 1]))  # row 1: one valid step
        >>> rb = ReplayBuffer(capacity=3, generator=torch.Generator().manual_seed(0))
        >>> rb.add(tdt), len(rb), rb.n_added
        (4, 3, 4)
        >>> rb.transitions()["observation/frame"].flatten().tolist()  # oldest first
        [1, 2, 3]
        >>> batch = rb.sample(5)
        >>> batch.n_elems(), batch["observation/frame"].shape, batch["action/action"].dtype
        (5, torch.Size([5, 1]), torch.int64)
    """

    def __init__(
        self,
        capacity: int,
        device: DeviceLike = "cpu",
        keys: Sequence[str] | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ConfigError(f"ReplayBuffer: capacity must be an int > 0, got {capacity!r}")
        self._capacity = capacity
        self._device = buffer_device(device, "ReplayBuffer")
        self._requested_keys = buffer_keys(keys, "ReplayBuffer")
        self._generator = buffer_generator(generator, self._device, "ReplayBuffer")
        self._storage: dict[str, Tensor] | None = None
        self._position = 0  # row the next transition goes to
        self._size = 0
        self._n_added = 0

    # ------------------------------------------------------------------ description
    @property
    def capacity(self) -> int:
        """The maximum number of transitions kept."""
        return self._capacity

    @property
    def device(self) -> torch.device:
        """The device of the storage and of sampled batches."""
        return self._device

    @property
    def n_added(self) -> int:
        """The number of transitions added since construction (or ``clear``), overwritten ones
        included."""
        return self._n_added

    @property
    def position(self) -> int:
        """The storage row the next transition is written to (the oldest one once full)."""
        return self._position

    def __len__(self) -> int:
        """The number of transitions stored (``min(n_added, capacity)``)."""
        return self._size

    def keys(self) -> tuple[str, ...]:
        """The stored keys; before the first ``add``, the requested ``keys`` (or ``()``)."""
        if self._storage is not None:
            return tuple(self._storage)
        return self._requested_keys or ()

    def specs(self) -> dict[str, _Spec]:
        """``{key: (feature_shape, dtype)}`` of the storage (``{}`` before the first ``add``)."""
        if self._storage is None:
            return {}
        return {k: (v.shape[1:], v.dtype) for k, v in self._storage.items()}

    def __repr__(self) -> str:
        lines = [
            f"ReplayBuffer(capacity={self._capacity}, len={self._size}, "
            f"n_added={self._n_added}, device={self._device}"
        ]
        for k, (shape, dtype) in self.specs().items():
            lines.append(f"  {k}: {tuple(shape)} {str(dtype).replace('torch.', '')}")
        return "\n".join(lines) + ")"

    # ------------------------------------------------------------------ checks
    def _check_specs(self, specs: dict[str, _Spec], where: str) -> None:
        """Raises unless ``specs`` match the storage's keys, feature shapes and dtypes."""
        stored = self.specs()
        if specs.keys() != stored.keys():
            missing = sorted(stored.keys() - specs.keys())
            extra = sorted(specs.keys() - stored.keys())
            raise KeyMismatchError(
                f"ReplayBuffer.{where}: keys differ from the stored ones: missing {missing}, "
                f"unexpected {extra}; pass keys=[...] to the ReplayBuffer to store a subset"
            )
        for k, (shape, dtype) in specs.items():
            exp_shape, exp_dtype = stored[k]
            if shape != exp_shape:
                raise ShapeError(
                    f"ReplayBuffer.{where}: key {k!r} has feature shape {tuple(shape)}, "
                    f"expected {tuple(exp_shape)} like the storage"
                )
            if dtype != exp_dtype:
                raise ShapeError(
                    f"ReplayBuffer.{where}: key {k!r} has dtype {dtype}, expected {exp_dtype} "
                    "like the storage (the buffer never casts; convert before adding)"
                )

    def _allocate(self, specs: dict[str, _Spec]) -> None:
        self._storage = {
            k: torch.empty((self._capacity, *shape), dtype=dtype, device=self._device)
            for k, (shape, dtype) in specs.items()
        }

    def _select(self, tdt: TemporalDictTensor) -> TemporalDictTensor:
        """The batch restricted to the keys this buffer stores (checked)."""
        wanted = self._requested_keys
        if wanted is None and self._storage is not None:
            wanted = tuple(self._storage)
        if wanted is None:
            if not list(tdt.keys()):
                raise KeyMismatchError("ReplayBuffer.add: the batch has no key to store")
            return tdt
        missing = [k for k in wanted if k not in tdt]
        if missing:
            raise KeyMismatchError(
                f"ReplayBuffer.add: the batch lacks keys {missing}; it has {sorted(tdt.keys())}"
            )
        if self._requested_keys is None:
            extra = sorted(set(tdt.keys()) - set(wanted))
            if extra:
                raise KeyMismatchError(
                    f"ReplayBuffer.add: unexpected keys {extra} (the storage holds "
                    f"{sorted(wanted)}); pass keys=[...] to the ReplayBuffer to store a subset"
                )
        return tdt.get(wanted)

    # ------------------------------------------------------------------ write
    def _write(self, rows: dict[str, Tensor], n: int) -> None:
        """Writes ``n <= capacity`` rows at ``position`` (two slice copies on wrap-around)."""
        assert self._storage is not None and n <= self._capacity
        pos = self._position
        first = min(n, self._capacity - pos)
        with torch.no_grad():  # a source that requires grad must not pull the storage into a graph
            for k, dst in self._storage.items():
                src = rows[k]
                dst[pos : pos + first].copy_(src[:first])
                if n > first:
                    dst[: n - first].copy_(src[first:n])
        self._position = (pos + n) % self._capacity
        self._size = min(self._size + n, self._capacity)

    def add(self, trajectories: Trajectories | TemporalDictTensor) -> int:
        """Stores the valid steps of ``trajectories`` as transitions, overwriting the oldest.

        The ``sum(lengths)`` valid steps are taken row by row in time order (padding is never
        stored) and copied to ``device``; when there are more than ``capacity``, only the last
        ``capacity`` are kept, exactly as if they had been added one by one.

        Args:
            trajectories: a batch ``(B, T, *feat)`` with lengths ``(B,)``, on any device. Its
                ``info`` (for a :class:`~rlstruct.Trajectories`) is ignored.

        Returns:
            The number of transitions added, ``sum(lengths)`` (overwritten ones included).

        Raises:
            TypeError: ``trajectories`` is neither Trajectories nor a TemporalDictTensor.
            KeyMismatchError: a stored (or requested) key is missing, or, without ``keys``, the
                batch has other keys than the first one.
            ShapeError: a key's feature shape or dtype differs from the storage's.
        """
        if isinstance(trajectories, Trajectories):
            trajectories = trajectories.trajectories
        if not isinstance(trajectories, TemporalDictTensor):
            raise TypeError(
                "ReplayBuffer.add takes Trajectories or a TemporalDictTensor, got "
                f"{type(trajectories).__name__}"
            )
        tdt = self._select(trajectories)
        specs = tdt.specs()
        if self._storage is None:
            self._allocate(specs)
        else:
            self._check_specs(specs, "add")
        flat = tdt.to_transitions()  # on the batch's device: copy only the valid rows
        n = flat.n_elems()
        kept = min(n, self._capacity)
        rows = {k: v[n - kept :] for k, v in flat.items()}
        self._write(rows, kept)
        self._n_added += n
        return n

    def clear(self) -> None:
        """Empties the buffer (``len`` and ``n_added`` back to 0); the storage, its keys, shapes
        and dtypes are kept (allocated once), and so is the generator's state."""
        self._position = 0
        self._size = 0
        self._n_added = 0

    # ------------------------------------------------------------------ read
    def _get_generator(self) -> torch.Generator | None:
        if self._device.type == "meta":
            return None
        if self._generator is None:
            seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
            self._generator = torch.Generator(device=self._device).manual_seed(seed)
        return self._generator

    def sample(self, n: int) -> DictTensor:
        """``n`` transitions drawn uniformly with replacement from the stored ones.

        Indices are drawn on ``device`` with the buffer's generator (no host round trip).

        Args:
            n: the number of transitions (>= 0).

        Returns:
            A DictTensor ``(n, *feat)`` on ``device`` with the stored keys (new tensors).

        Raises:
            ShapeError: the buffer is empty or ``n < 0``. ``ShapeError`` (a ``ValueError``) is
                what :meth:`Trajectories.sample <rlstruct.Trajectories.sample>` raises for rows
                drawn from an empty batch: the same mistake gets the same type here.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ShapeError(f"ReplayBuffer.sample: n must be an int >= 0, got {n!r}")
        if self._size == 0 or self._storage is None:
            raise ShapeError(
                f"ReplayBuffer.sample: cannot sample {n} transitions from an empty buffer; "
                "add trajectories first (check len(buffer) before sampling)"
            )
        idx = torch.randint(
            self._size, (n,), generator=self._get_generator(), device=self._device
        )
        out = {k: v[idx] for k, v in self._storage.items()}
        return DictTensor.trusted(out, n, self._device)

    def transitions(self) -> DictTensor:
        """Every stored transition, oldest first: a DictTensor ``(len(self), *feat)`` (a copy).

        Raises:
            ShapeError: nothing was ever added (no keys yet).
        """
        if self._storage is None:
            raise ShapeError("ReplayBuffer.transitions: nothing was added yet")
        start = self._position if self._size == self._capacity else 0
        out = {
            k: torch.cat([v[start : self._size], v[:start]]) for k, v in self._storage.items()
        }
        return DictTensor.trusted(out, self._size, self._device)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The buffer's content and counters, for ``torch.save`` (``weights_only`` safe).

        The tensors are the filled rows ``[0, len(self))`` of the storage in storage order: views
        that share memory with the buffer, like ``nn.Module.state_dict`` (save or clone them
        before the next ``add``). Keys: ``capacity``, ``position``, ``size``, ``n_added``,
        ``keys`` (the requested keys or None), ``tensors`` (``{key: (size, *feat)}``, ``{}`` before
        the first ``add``) and ``generator_state`` (a uint8 tensor, or None before the first
        ``sample`` without a generator).
        """
        tensors = {}
        if self._storage is not None:
            tensors = {k: v[: self._size] for k, v in self._storage.items()}
        gen = self._generator
        return {
            "capacity": self._capacity,
            "position": self._position,
            "size": self._size,
            "n_added": self._n_added,
            "keys": list(self._requested_keys) if self._requested_keys is not None else None,
            "tensors": tensors,
            "generator_state": gen.get_state() if gen is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores content, counters and generator state saved by :meth:`state_dict`.

        The tensors may live on any device (e.g. ``torch.load(map_location="cpu")``); they are
        copied into this buffer's storage, allocated from their specs if needed.

        Raises:
            ConfigError: another capacity, inconsistent counters, or a generator state saved on
                another device type.
            KeyMismatchError: other keys than the stored (or requested) ones.
            ShapeError: another feature shape or dtype than the storage's.
        """
        if state["capacity"] != self._capacity:
            raise ConfigError(
                f"ReplayBuffer.load_state_dict: the state has capacity {state['capacity']}, "
                f"this buffer {self._capacity}; build the buffer with the saved capacity"
            )
        size, position = int(state["size"]), int(state["position"])
        n_added = int(state["n_added"])
        tensors: dict[str, Tensor] = dict(state["tensors"])
        if not (
            0 <= size <= self._capacity
            and 0 <= position < self._capacity
            and n_added >= size
            and (size == self._capacity or position == size)
        ):
            raise ConfigError(
                f"ReplayBuffer.load_state_dict: inconsistent state (size={size}, "
                f"position={position}, n_added={n_added}, capacity={self._capacity})"
            )
        specs = {k: (v.shape[1:], v.dtype) for k, v in tensors.items()}
        for k, v in tensors.items():
            if v.dim() == 0 or v.shape[0] != size:
                raise ShapeError(
                    f"ReplayBuffer.load_state_dict: key {k!r} has shape {tuple(v.shape)}, "
                    f"expected {size} rows (size)"
                )
        if self._requested_keys is not None and tensors and (
            set(tensors) != set(self._requested_keys)
        ):
            raise KeyMismatchError(
                f"ReplayBuffer.load_state_dict: the state holds keys {sorted(tensors)}, this "
                f"buffer stores {sorted(self._requested_keys)}"
            )
        if self._storage is not None and tensors:
            self._check_specs(specs, "load_state_dict")
        if not tensors and size:
            raise ConfigError("ReplayBuffer.load_state_dict: size > 0 but no tensors")
        generator = self._generator
        gen_state = state.get("generator_state")
        if gen_state is not None and self._device.type != "meta":
            # Restored into a fresh generator first: a bad state raises before anything changes.
            generator = torch.Generator(device=self._device)
            try:
                generator.set_state(gen_state)
            except RuntimeError as e:  # e.g. a CPU generator's state for a CUDA buffer
                raise ConfigError(
                    f"ReplayBuffer.load_state_dict: cannot restore the generator state on "
                    f"{self._device}: {e}"
                ) from e
        if self._storage is None and tensors:
            self._allocate(specs)
        if tensors:
            with torch.no_grad():
                for k, dst in self._storage.items():
                    dst[:size].copy_(tensors[k])
        self._size, self._position, self._n_added = size, position, n_added
        if generator is not self._generator:
            if self._generator is None:
                self._generator = generator
            else:  # keep the user's generator object, with the saved state
                self._generator.set_state(generator.get_state())

"""``FrameReplayBuffer``: a replay buffer for stacked image observations that stores each frame
once (DQN on Atari).

A plain :class:`~rlstruct.blocks.replay_buffer.ReplayBuffer` keeps ``observation/frame`` and
``_observation/frame`` whole: an Atari transition of two ``(4, 84, 84)`` uint8 stacks costs
56,448 bytes. This one keeps each distinct 84x84 frame one time (7,056 bytes) and rebuilds the
stacks at sample time, so 1M transitions fit in about 7.2 GB.

Invariant:
    the frames live in a circular store of ``frame_capacity`` slots (frame number ``g`` in slot
    ``g % frame_capacity``); each transition holds the ``K`` frame numbers of its two stacks
    (:mod:`rlstruct.blocks.frame_ids` decides, from the pixels, which frames are shared). The
    stored transitions are the newest ``len(self)`` added, at most ``capacity``; one whose frames
    were overwritten is dropped with every older one, so every stored transition rebuilds the
    stacks it was given, bit for bit. The other keys (action, reward, flags) are stored as in
    ``ReplayBuffer``. Stacks never cross an episode boundary: a reset's stack is the env's own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.blocks.frame_ids import plan_frames
from rlstruct.blocks.replay_config import buffer_device, buffer_generator, buffer_keys
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.errors import ConfigError, KeyMismatchError, ShapeError
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories

__all__ = ["FrameReplayBuffer", "default_frame_capacity"]


def default_frame_capacity(capacity: int) -> int:
    """Frame slots for ``capacity`` transitions: one frame a step, plus 2% and 1,024 for the
    frames of reset stacks (an Atari episode lasts hundreds of steps)."""
    return capacity + capacity // 50 + 1024


class FrameReplayBuffer:
    """A fixed-capacity circular buffer of transitions whose stacked frames are stored once.

    The same use as :class:`~rlstruct.blocks.replay_buffer.ReplayBuffer` (``add``, ``sample``,
    ``transitions``, ``state_dict``): samples carry ``observation/<frame_key>`` and
    ``_observation/<frame_key>`` as ``(n, K, *frame)`` stacks, equal to those added.

    Args:
        capacity: the maximum number of transitions kept (> 0).
        device: where frames and transitions live and samples are returned.
        keys: the trajectory keys to store; they must include ``observation/<frame_key>`` and
            ``_observation/<frame_key>``. ``None`` stores every key of the first batch.
        frame_key: the observation key holding the stacks ``(K, *frame)``, stacked on dim 0.
        frame_capacity: the frame slots (default :func:`default_frame_capacity`); fewer slots
            than the transitions need only make the buffer hold fewer transitions.
        generator: a ``torch.Generator`` on ``device`` for ``sample`` (``None``: one seeded from
            torch's global RNG at the first ``sample``).

    Raises:
        ConfigError: a capacity is not a positive int, the device cannot be used, or ``keys`` is
            malformed or lacks a frame key.
    """

    def __init__(
        self,
        capacity: int,
        device: DeviceLike = "cpu",
        keys: Sequence[str] | None = None,
        frame_key: str = K.FRAME,
        frame_capacity: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        frame_capacity = default_frame_capacity(capacity) if frame_capacity is None else (
            frame_capacity)
        for name, value in (("capacity", capacity), ("frame_capacity", frame_capacity)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"FrameReplayBuffer: {name} must be an int > 0, got {value!r}")
        self._capacity, self._frame_capacity = capacity, frame_capacity
        self._device = buffer_device(device, "FrameReplayBuffer")
        self._obs_key, self._next_key = K.OBSERVATION + frame_key, K.NEXT_OBSERVATION + frame_key
        self._requested_keys = buffer_keys(keys, "FrameReplayBuffer")
        if self._requested_keys is not None and not {self._obs_key, self._next_key} <= set(
                self._requested_keys):
            raise ConfigError(
                f"FrameReplayBuffer: keys must include {self._obs_key!r} and {self._next_key!r} "
                f"(the stacks of frame_key {frame_key!r}); got {list(self._requested_keys)}")
        self._generator = buffer_generator(generator, self._device, "FrameReplayBuffer")
        self._keys: tuple[str, ...] = ()
        self._plain: dict[str, Tensor] = {}  # (capacity, *feat) per key but the frame keys
        self._ids: Tensor | None = None  # (capacity, 2, K) frame numbers: observation, next
        self._oldest: Tensor | None = None  # (capacity,) the smallest of each row's numbers
        self._frames: Tensor | None = None  # (frame_capacity, prod(frame)): one row a frame
        self._frame_shape: tuple[int, ...] = ()
        self._streams: dict[int, Tensor] = {}  # env id -> its last next-observation numbers
        self._head = self._size = self._filled = self._n_added = self._n_frames = 0

    # ------------------------------------------------------------------ description
    @property
    def capacity(self) -> int:
        """The maximum number of transitions kept."""
        return self._capacity

    @property
    def frame_capacity(self) -> int:
        """The frame slots."""
        return self._frame_capacity

    @property
    def device(self) -> torch.device:
        """The device of the storage and of sampled batches."""
        return self._device

    @property
    def n_added(self) -> int:
        """The transitions added since construction, dropped ones included."""
        return self._n_added

    @property
    def n_frames(self) -> int:
        """The frames stored since construction, overwritten ones included."""
        return self._n_frames

    def __len__(self) -> int:
        """The number of transitions stored."""
        return self._size

    def keys(self) -> tuple[str, ...]:
        """The stored keys (the frame keys included)."""
        return self._keys or self._requested_keys or ()

    def nbytes(self) -> int:
        """Bytes of storage allocated (frames, numbers and the other keys)."""
        tensors = [*self._plain.values(), self._ids, self._oldest, self._frames]
        return sum(v.numel() * v.element_size() for v in tensors if v is not None)

    def __repr__(self) -> str:
        return (f"FrameReplayBuffer(capacity={self._capacity}, len={self._size}, "
                f"frame_capacity={self._frame_capacity}, n_frames={self._n_frames}, "
                f"device={self._device})")

    # ------------------------------------------------------------------ write
    def _select(self, tdt: TemporalDictTensor) -> TemporalDictTensor:
        wanted = self._keys or self._requested_keys or tuple(tdt.keys())
        missing = [k for k in wanted if k not in tdt]
        if missing or not {self._obs_key, self._next_key} <= set(wanted):
            raise KeyMismatchError(
                f"FrameReplayBuffer.add: the batch lacks keys "
                f"{missing or [self._obs_key, self._next_key]}; it has {sorted(tdt.keys())}")
        return tdt.get(wanted)

    def _allocate(self, specs: dict[str, tuple[torch.Size, torch.dtype]]) -> None:
        stack, dtype = specs[self._obs_key]
        if len(stack) < 2 or specs[self._next_key] != (stack, dtype):
            raise ShapeError(
                f"FrameReplayBuffer.add: {self._obs_key!r} must be stacks (K, *frame) and "
                f"{self._next_key!r} the same; got {tuple(stack)} {dtype} and "
                f"{tuple(specs[self._next_key][0])} {specs[self._next_key][1]}")
        device, c = self._device, self._capacity
        self._keys = tuple(specs)
        self._plain = {k: torch.empty((c, *shape), dtype=dt, device=device)
                       for k, (shape, dt) in specs.items()
                       if k not in (self._obs_key, self._next_key)}
        self._ids = torch.empty((c, 2, stack[0]), dtype=torch.int64, device=device)
        self._oldest = torch.empty(c, dtype=torch.int64, device=device)
        # One row of pixels per frame: index_select on rows is several times faster than
        # advanced indexing of (frame_capacity, *frame).
        self._frame_shape = tuple(stack[1:])
        self._frames = torch.empty((self._frame_capacity, math.prod(self._frame_shape)),
                                   dtype=dtype, device=device)

    def _check(self, specs: dict[str, tuple[torch.Size, torch.dtype]]) -> None:
        stored = {k: (v.shape[1:], v.dtype) for k, v in self._plain.items()}
        assert self._ids is not None and self._frames is not None
        stored[self._obs_key] = stored[self._next_key] = (
            torch.Size((self._ids.shape[2], *self._frame_shape)), self._frames.dtype)
        for k, spec in specs.items():
            if spec != stored[k]:
                raise ShapeError(
                    f"FrameReplayBuffer.add: key {k!r} is {tuple(spec[0])} {spec[1]}, expected "
                    f"{tuple(stored[k][0])} {stored[k][1]} like the storage (nothing is cast)")

    def _known(self, streams: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        """Each row's stream's last next-observation numbers, whether they are still stored,
        and their pixels."""
        assert self._ids is not None and self._frames is not None
        k, f = self._ids.shape[2], self._frame_capacity
        ids = torch.zeros(len(streams), k, dtype=torch.int64, device=self._device)
        known = torch.zeros(len(streams), dtype=torch.bool, device=self._device)
        for row, stream in enumerate(streams):
            last = self._streams.get(stream)
            if last is not None and int(last.min()) >= self._n_frames - f:
                ids[row], known[row] = last, True
        return ids, known, self._stacks(ids)

    def _stacks(self, ids: Tensor) -> Tensor:
        """The stacks ``(n, K, *frame)`` of the frame numbers ``ids`` ``(n, K)``."""
        assert self._frames is not None
        rows = self._frames.index_select(0, (ids % self._frame_capacity).flatten())
        return rows.view(*ids.shape, *self._frame_shape)

    def _write_rows(self, rows: dict[str, Tensor], ids: Tensor) -> None:
        """Writes the last ``capacity`` of the given transitions after the newest stored one."""
        assert self._ids is not None and self._oldest is not None
        n = ids.shape[0]
        kept = min(n, self._capacity)
        slots = (self._head + torch.arange(kept, device=self._device)) % self._capacity
        with torch.no_grad():
            for key, dst in self._plain.items():
                dst[slots] = rows[key][n - kept:]
            self._ids[slots] = ids[n - kept:]
            self._oldest[slots] = ids[n - kept:].flatten(1).min(1).values
        self._head = (self._head + kept) % self._capacity
        self._size = min(self._size + kept, self._capacity)
        self._filled = min(self._filled + kept, self._capacity)

    def _drop_overwritten(self) -> None:
        """Drops the oldest transitions up to the newest one that lost a frame."""
        assert self._oldest is not None
        lost = self._oldest[self._window()] < self._n_frames - self._frame_capacity
        if bool(lost.any()):
            self._size -= int(torch.nonzero(lost)[-1]) + 1

    def add(self, trajectories: Trajectories | TemporalDictTensor) -> int:
        """Stores the valid steps of ``trajectories``, each frame once, dropping the oldest.

        Args:
            trajectories: a batch ``(B, T, *feat)`` with lengths ``(B,)``, on any device. The
                ``env_id`` of a :class:`~rlstruct.Trajectories`' info tells which stream a row
                continues (else the row index): its first stack is shared with the last one kept.

        Returns:
            The number of transitions added, ``sum(lengths)``.

        Raises:
            TypeError: ``trajectories`` is neither Trajectories nor a TemporalDictTensor.
            KeyMismatchError: a stored key, or a frame key, is missing.
            ShapeError: a key's feature shape or dtype differs from the storage's, or the frame
                keys are not stacks ``(K, *frame)``.
        """
        info = trajectories.info if isinstance(trajectories, Trajectories) else None
        tdt = trajectories.trajectories if isinstance(trajectories, Trajectories) else (
            trajectories)
        if not isinstance(tdt, TemporalDictTensor):
            raise TypeError("FrameReplayBuffer.add takes Trajectories or a TemporalDictTensor, "
                            f"got {type(trajectories).__name__}")
        tdt = self._select(tdt).to(self._device)
        if self._frames is None:
            self._allocate(tdt.specs())
        self._check(tdt.specs())
        b = tdt.n_elems()
        streams = (info[K.ENV_ID].reshape(b, -1)[:, 0].tolist()
                   if info is not None and K.ENV_ID in info else list(range(b)))
        lengths = tdt.lengths
        plan = plan_frames(tdt[self._obs_key], tdt[self._next_key], lengths, self._n_frames,
                           *self._known(streams))
        keep = plan.new_ids >= plan.n_frames - self._frame_capacity
        assert self._frames is not None
        with torch.no_grad():
            self._frames.index_copy_(0, plan.new_ids[keep] % self._frame_capacity,
                                     plan.new_frames[keep].flatten(1))
        self._n_frames = plan.n_frames
        for row, stream in enumerate(streams):
            if int(lengths[row]) > 0:
                self._streams[stream] = plan.next_ids[row, int(lengths[row]) - 1].clone()
        mask = tdt.mask()
        ids = torch.stack([plan.obs_ids[mask], plan.next_ids[mask]], 1)
        flat = tdt.get(list(self._plain)).to_transitions()
        self._write_rows(dict(flat.items()), ids)
        self._drop_overwritten()
        self._n_added += ids.shape[0]
        return ids.shape[0]

    # ------------------------------------------------------------------ read
    def _window(self) -> Tensor:
        """The storage rows of the stored transitions, oldest first."""
        start = self._head - self._size
        return (start + torch.arange(self._size, device=self._device)) % self._capacity

    def _rows(self, slots: Tensor) -> DictTensor:
        assert self._ids is not None
        ids = self._ids.index_select(0, slots)  # (n, 2, K)
        out: dict[str, Tensor] = {}
        for key in self._keys:
            if key == self._obs_key:
                out[key] = self._stacks(ids[:, 0])
            elif key == self._next_key:
                out[key] = self._stacks(ids[:, 1])
            else:
                out[key] = self._plain[key].index_select(0, slots)
        return DictTensor.trusted(out, slots.shape[0], self._device)

    def sample(self, n: int) -> DictTensor:
        """``n`` transitions drawn uniformly with replacement from the stored ones.

        Returns:
            A DictTensor ``(n, *feat)`` on ``device``; the frame keys are ``(n, K, *frame)``.

        Raises:
            ShapeError: the buffer is empty or ``n < 0``.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ShapeError(f"FrameReplayBuffer.sample: n must be an int >= 0, got {n!r}")
        if self._size == 0:
            raise ShapeError(f"FrameReplayBuffer.sample: cannot sample {n} transitions from an "
                             "empty buffer; add trajectories first")
        if self._generator is None:
            seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
            self._generator = torch.Generator(device=self._device).manual_seed(seed)
        idx = torch.randint(self._size, (n,), generator=self._generator, device=self._device)
        start = self._head - self._size
        return self._rows((start + idx) % self._capacity)

    def transitions(self) -> DictTensor:
        """Every stored transition, oldest first: a DictTensor ``(len(self), *feat)``.

        Raises:
            ShapeError: nothing was ever added.
        """
        if self._frames is None:
            raise ShapeError("FrameReplayBuffer.transitions: nothing was added yet")
        return self._rows(self._window())

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The buffer's content and counters, for ``torch.save`` (``weights_only`` safe).

        The tensors are views of the storage (no copy of the frames is made)."""
        filled = min(self._n_frames, self._frame_capacity)
        streams = sorted(self._streams)
        return {
            "capacity": self._capacity, "frame_capacity": self._frame_capacity,
            "head": self._head, "size": self._size, "filled": self._filled,
            "n_added": self._n_added, "n_frames": self._n_frames, "keys": list(self._keys),
            "frame_shape": list(self._frame_shape),
            "plain": {k: v[: self._filled] for k, v in self._plain.items()},
            "ids": None if self._ids is None else self._ids[: self._filled],
            "frames": None if self._frames is None else self._frames[:filled],
            "stream_ids": torch.tensor(streams, dtype=torch.int64),
            "stream_frames": (torch.stack([self._streams[s] for s in streams]) if streams
                              else torch.zeros(0, dtype=torch.int64)),
            "generator_state": None if self._generator is None else self._generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` saved (its tensors may be on any device).

        Raises:
            ConfigError: another capacity or frame capacity, or inconsistent counters.
        """
        for name in ("capacity", "frame_capacity"):
            if state[name] != getattr(self, name):
                raise ConfigError(
                    f"FrameReplayBuffer.load_state_dict: the state has {name} {state[name]}, this "
                    f"buffer {getattr(self, name)}; build the buffer with the saved one")
        head, size, filled = int(state["head"]), int(state["size"]), int(state["filled"])
        if not (0 <= size <= filled <= self._capacity and 0 <= head < self._capacity
                and (filled == self._capacity or head == filled)):
            raise ConfigError(f"FrameReplayBuffer.load_state_dict: inconsistent state "
                              f"(head={head}, size={size}, filled={filled})")
        if state["frames"] is not None:
            ids, frames = state["ids"], state["frames"]
            specs = {k: (v.shape[1:], v.dtype) for k, v in state["plain"].items()}
            stack = torch.Size((ids.shape[2], *state["frame_shape"]))
            specs[self._obs_key] = specs[self._next_key] = (stack, frames.dtype)
            if self._frames is None:
                self._allocate({k: specs[k] for k in state["keys"]})
            self._check(specs)
            assert self._ids is not None and self._oldest is not None and self._frames is not None
            with torch.no_grad():
                for k, v in state["plain"].items():
                    self._plain[k][:filled] = v
                self._ids[:filled] = ids
                self._oldest[:filled] = ids.flatten(1).min(1).values
                self._frames[: frames.shape[0]] = frames
        self._head, self._size, self._filled = head, size, filled
        self._n_added, self._n_frames = int(state["n_added"]), int(state["n_frames"])
        self._streams = {int(s): f.to(self._device) for s, f in
                         zip(state["stream_ids"].tolist(), state["stream_frames"])}
        if state.get("generator_state") is not None and self._device.type != "meta":
            generator = self._generator or torch.Generator(device=self._device)
            generator.set_state(state["generator_state"])
            self._generator = generator

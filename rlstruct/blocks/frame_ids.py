"""Which frames of a batch of stacked observations are new, and the frame numbers of each stack:
the bookkeeping of :class:`~rlstruct.blocks.frame_buffer.FrameReplayBuffer`.

An observation here is a stack ``(K, *frame)`` of ``K`` frames (Atari: ``(4, 84, 84)`` uint8).
Each distinct frame gets a number (``gid``, counting up from the buffer's ``n_frames``) once, and
each stack is described by the ``K`` numbers of its frames. A frame is shared, never stored again:

- with the previous stack of its row when they are equal (``observation`` at ``t`` is the
  ``_observation`` at ``t - 1`` except after an episode's end);
- between a stack and the next one when the next one is the first shifted by one frame
  (``_observation[:-1] == observation[1:]``): one new frame, the newest;
- between neighbouring frames of one stack when they are equal (the padding of a reset stack).

Every sharing is decided by comparing the pixels, so a stack rebuilt from the numbers is the
stack that was given, bit for bit, whatever the env does; an env that stacks frames the usual way
costs one frame per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["FramePlan", "plan_frames"]


def _equal(a: Tensor, b: Tensor, dims: int) -> Tensor:
    """``(a == b)`` reduced over the trailing ``dims`` dimensions: one bool per leading index."""
    return (a == b).flatten(a.dim() - dims).all(-1)


def _words(stacks: Tensor) -> Tensor:
    """``(B, T, K, *frame)`` as ``(B, T, K, W)``: each frame flattened, and read 8 bytes at a
    time where its bytes allow (a uint8 84x84 frame is 882 int64 words), so that comparing
    frames costs an eighth of the element comparisons."""
    flat = stacks.flatten(3)
    n_bytes = flat.shape[-1] * flat.element_size()
    if flat.is_contiguous() and n_bytes % 8 == 0 and flat.element_size() < 8:
        return flat.view(torch.int64)
    return flat


def _fresh(new: Tensor, start: int) -> tuple[Tensor, int]:
    """Numbers for stacks stored whole: ``new`` ``(R, K)`` marks each stack's frames that are not
    the previous frame again (``new[:, 0]`` true). Returns ``(ids (R, K), next start)``: the
    frames marked new get ``start, start + 1, ...`` row by row; the others repeat the previous
    frame's number."""
    counts = new.sum(1)
    base = start + torch.cumsum(counts, 0) - counts  # each row's first number
    ids = base.unsqueeze(1) + torch.cumsum(new.long(), 1) - 1
    return ids, start + int(counts.sum())


@dataclass
class FramePlan:
    """The outcome of :func:`plan_frames` for one batch ``(B, T)``.

    Attributes:
        obs_ids: ``(B, T, K)`` int64, the frame numbers of each ``observation`` stack.
        next_ids: ``(B, T, K)`` int64, those of each ``_observation`` stack.
        new_ids: ``(M,)`` int64, the numbers of the ``M`` frames to store, ascending.
        new_frames: ``(M, *frame)``, their pixels, in the same order.
        n_frames: the frame count after this batch (the next number to give).
    """

    obs_ids: Tensor
    next_ids: Tensor
    new_ids: Tensor
    new_frames: Tensor
    n_frames: int


def _first_stacks(obs: Tensor, known: Tensor, known_frames: Tensor) -> Tensor:
    """Which rows' first stack ``obs[:, 0]`` is the stack the buffer already holds for the row:
    ``known`` ``(B,)`` says whether one is held, ``known_frames`` ``(B, K, W)`` its pixels (as
    :func:`_words`, like ``obs`` ``(B, T, K, W)``)."""
    same = torch.zeros_like(known)
    if bool(known.any()):
        same[known] = _equal(obs[known, 0], known_frames[known], 2)
    return same


def plan_frames(
    obs: Tensor, next_obs: Tensor, lengths: Tensor, n_frames: int,
    known_ids: Tensor, known: Tensor, known_frames: Tensor,
) -> FramePlan:
    """Numbers every stack of a batch, sharing what the pixels show to be shared.

    The pixels are compared once for the whole batch; the numbering then walks the ``T`` steps
    on ``(B, K)`` integers, and the new frames are gathered in one copy at the end.

    Args:
        obs: ``(B, T, K, *frame)``, the ``observation`` stacks.
        next_obs: ``(B, T, K, *frame)``, the ``_observation`` stacks (at an episode's end, the
            true final observation).
        lengths: ``(B,)`` int64, the valid steps of each row (later steps are not numbered).
        n_frames: the number the first new frame gets.
        known_ids: ``(B, K)`` int64, the numbers of the last ``_observation`` stack the buffer
            holds for each row's stream (any value where ``known`` is false).
        known: ``(B,)`` bool, whether ``known_ids`` holds (and its frames are still stored).
        known_frames: ``(B, K, *frame)``, the pixels of those stacks.

    Returns:
        The plan: the numbers of every valid stack and the new frames to store.
    """
    b, t_max, k = obs.shape[:3]
    obs_w, next_w = _words(obs), _words(next_obs)
    shifted = _equal(next_w[:, :, :-1], obs_w[:, :, 1:], 2)  # (B, T)
    continues = _equal(obs_w[:, 1:], next_w[:, :-1], 2)  # (B, T - 1)
    obs_ids = torch.zeros(b, t_max, k, dtype=torch.int64, device=obs.device)
    next_ids = torch.zeros_like(obs_ids)
    new = _NewFrames(obs, next_obs, obs_w, next_w)
    previous, same = known_ids, _first_stacks(obs_w, known, _words(known_frames[:, None])[:, 0])
    for t in range(t_max):
        active = lengths > t
        if t > 0:
            previous, same = next_ids[:, t - 1], continues[:, t - 1]
        # 1. The observation: the previous stack again, or its distinct frames stored anew.
        o = previous.clone()
        n_frames = new.whole(0, active & ~same, t, o, n_frames)
        obs_ids[:, t] = o
        # 2. The next observation: the stack shifted by one new frame, or stored anew.
        n = torch.zeros_like(o)
        step = torch.nonzero(active & shifted[:, t]).squeeze(1)
        if step.numel():
            newest = n_frames + torch.arange(step.numel(), device=obs.device)
            n[step] = torch.cat([o[step, 1:], newest.unsqueeze(1)], 1)
            n_frames += step.numel()
            new.add(1, newest, step, t, torch.full_like(step, k - 1))
        n_frames = new.whole(1, active & ~shifted[:, t], t, n, n_frames)
        next_ids[:, t] = n
    new_ids, new_frames = new.gather()
    return FramePlan(obs_ids, next_ids, new_ids, new_frames, n_frames)


class _NewFrames:
    """The frames a plan stores, recorded as ``(number, source, row, step, slot)`` and gathered
    from ``obs`` (source 0) or ``next_obs`` (source 1) in one copy each."""

    def __init__(self, obs: Tensor, next_obs: Tensor, obs_w: Tensor, next_w: Tensor) -> None:
        self.sources, self.words = (obs, next_obs), (obs_w, next_w)
        self.parts: tuple[list[list[Tensor]], list[list[Tensor]]] = ([], [])

    def add(self, source: int, ids: Tensor, rows: Tensor, t: int, slots: Tensor) -> None:
        self.parts[source].append([ids, rows, torch.full_like(rows, t), slots])

    def whole(self, source: int, rows: Tensor, t: int, out: Tensor, n_frames: int) -> int:
        """Numbers the stacks at step ``t`` of ``rows`` (a ``(B,)`` mask) as stored whole, into
        ``out`` ``(B, K)``: returns the next free number."""
        rows = torch.nonzero(rows).squeeze(1)
        if not rows.numel():
            return n_frames
        stacks = self.words[source][rows, t]  # (R, K, W): few rows, rarely
        first = torch.ones(rows.numel(), 1, dtype=torch.bool, device=rows.device)
        new = torch.cat([first, ~_equal(stacks[:, 1:], stacks[:, :-1], 1)], 1)
        out[rows], n_frames = _fresh(new, n_frames)
        which, slot = torch.nonzero(new, as_tuple=True)
        self.add(source, out[rows][which, slot], rows[which], t, slot)
        return n_frames

    def gather(self) -> tuple[Tensor, Tensor]:
        """``(numbers (M,), pixels (M, *frame))`` of every recorded frame, by number."""
        ids, pixels = [], []
        obs_shape = self.sources[0].shape
        for source, parts in zip(self.sources, self.parts):
            if parts:
                number, rows, steps, slots = (torch.cat(p) for p in zip(*parts))
                ids.append(number)
                b, t_max, k = source.shape[:3]
                frames = source.reshape(b * t_max * k, -1)  # one row a frame: index_select
                pixels.append(frames.index_select(0, (rows * t_max + steps) * k + slots))
        if not ids:
            obs = self.sources[0]
            return (torch.zeros(0, dtype=torch.int64, device=obs.device),
                    obs.new_zeros((0, *obs.shape[3:])))
        number, frames = torch.cat(ids), torch.cat(pixels)
        order = torch.argsort(number)
        return number[order], frames.index_select(0, order).view(-1, *obs_shape[3:])

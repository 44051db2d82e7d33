"""What a model reads from an observation: one array, ``frame``, or the feature keys of a Dict.

An env with a one-array observation space (a ``Box``...) writes its observation under ``frame``;
one with a ``Dict`` (or ``Tuple``) space writes one key per leaf (``image``, ``vector``,
``a/b``: :mod:`rlstruct.envs.spaces`). A model's input is then:

- ``frame``, the tensor itself, where it is the observation's one feature key (no copy: the
  one-array path of every algorithm, Atari's included, is what it always was);
- else an :class:`ObsInput`, a ``dict`` of the **feature keys**: every leaf of the observation
  but the keys rlstruct adds (``reward``, ``done``, ``initial_state``... and ``info/<k>``) and
  :data:`~rlstruct.keys.ACTION_MASK` (the legal actions are never a model input). Each tensor
  keeps its dtype (a uint8 image stays uint8: the network divides by 255 inside).

:func:`model_input` reads it from an observation (``observation``, no prefix), from stored
trajectories (``steps, K.OBSERVATION`` or ``K.NEXT_OBSERVATION``) or from a replay sample;
:func:`input_keys` gives the full keys to keep (``steps.get(input_keys(steps) + [...])``). An
:class:`ObsInput` indexes, flattens and concatenates like a tensor, key by key, so that a loss
written for ``steps[K.OBS_FRAME][:, t]`` reads ``model_input(steps, K.OBSERVATION)[:, t]``.

Example:
    >>> import torch
    >>> from rlstruct import DictTensor
    >>> obs = DictTensor({"image": torch.zeros(2, 3, 8, 8, dtype=torch.uint8),
    ...                   "vector": torch.zeros(2, 4), "reward": torch.zeros(2),
    ...                   "action_mask": torch.ones(2, 2, dtype=torch.bool)})
    >>> x = model_input(obs)
    >>> sorted(x), x["image"].dtype, x[1:].n_rows
    (['image', 'vector'], torch.uint8, 1)
    >>> frame = torch.zeros(2, 4)
    >>> model_input(DictTensor({"frame": frame, "reward": torch.zeros(2)})) is frame
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.errors import KeyMismatchError

__all__ = ["ObsInput", "model_input", "input_keys", "is_feature_key", "cat_inputs",
           "expand_inputs"]

_NOT_FEATURES = frozenset((*K.ENV_KEYS, K.ACTION_MASK))


def is_feature_key(leaf: str) -> bool:
    """Whether the observation key ``leaf`` (no prefix) is a model input: not a key rlstruct
    adds (``reward``, ``done``..., ``info/<k>``) and not ``action_mask``."""
    return leaf not in _NOT_FEATURES and not leaf.startswith("info/")


class ObsInput(dict):  # type: ignore[type-arg]
    """The feature keys of an observation, ``key -> (n, *feat)`` tensors of their own dtypes,
    indexed like one tensor: ``x[idx]``, ``x.flatten(0, 1)``, ``x.to(device)`` apply to every
    key (a ``str`` index reads a key)."""

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str):
            return dict.__getitem__(self, index)
        return ObsInput({k: v[index] for k, v in self.items()})

    def flatten(self, start: int = 0, end: int = -1) -> ObsInput:
        """Each key's ``tensor.flatten(start, end)`` (the leading dims only: ``(B, T, ...)``)."""
        return ObsInput({k: v.flatten(start, end) for k, v in self.items()})

    def to(self, *args: Any, **kwargs: Any) -> ObsInput:
        """Each key's ``tensor.to(...)``."""
        return ObsInput({k: v.to(*args, **kwargs) for k, v in self.items()})

    @property
    def n_rows(self) -> int:
        """The leading size ``n`` (every key has it)."""
        return next(iter(self.values())).shape[0]


def input_keys(keys: Iterable[str], prefix: str = K.OBSERVATION) -> list[str]:
    """The full keys of the model input among ``keys``: ``prefix + leaf`` for each feature key
    (:func:`is_feature_key`), in order (``[prefix + "frame"]`` for a one-array env)."""
    return [k for k in keys if k.startswith(prefix) and is_feature_key(k[len(prefix):])]


def model_input(td: Any, prefix: str = "") -> Tensor | ObsInput:
    """The model's input of ``td`` (a DictTensor, a TemporalDictTensor, a replay sample) under
    ``prefix`` (``""`` for an observation, ``K.OBSERVATION``/``K.NEXT_OBSERVATION`` for stored
    steps): ``td[prefix + "frame"]`` itself where it is the one feature key, else an
    :class:`ObsInput` of the feature keys (a Dict's leaf named ``frame`` among them).

    Raises:
        KeyMismatchError: ``td`` holds neither ``frame`` nor a feature key under ``prefix``.
    """
    found = input_keys(td.keys(), prefix)
    if len(found) == 1 and found[0] == prefix + K.FRAME:
        return td[found[0]]
    if not found:
        raise KeyMismatchError(f"no model input under {prefix!r}: no feature key among "
                               f"{sorted(td.keys())}")
    return ObsInput({k[len(prefix):]: td[k] for k in found})


def cat_inputs(inputs: Sequence[Tensor | ObsInput]) -> Tensor | ObsInput:
    """``torch.cat`` along the rows, key by key for :class:`ObsInput` inputs."""
    if isinstance(inputs[0], ObsInput):
        return ObsInput({k: torch.cat([x[k] for x in inputs]) for k in inputs[0]})
    return torch.cat(list(inputs))


def expand_inputs(keys: Sequence[str], spec: Mapping[str, Any] | None) -> list[str]:
    """``keys`` (what a replay buffer stores) with ``observation/frame`` and
    ``_observation/frame`` each replaced by the feature keys of ``spec`` under the same prefix
    (the keys of a Dict observation's :func:`~rlstruct.blocks.multi_input.obs_spec`); None:
    ``keys`` as they are.

    Example:
        >>> expand_inputs([K.OBS_FRAME, K.NEXT_REWARD], {"image": {}, "vector": {}})
        ['observation/image', 'observation/vector', '_observation/reward']
    """
    if spec is None:
        return list(keys)
    out: list[str] = []
    for key in keys:
        if key in (K.OBS_FRAME, K.NEXT_FRAME):
            out += [key.removesuffix(K.FRAME) + leaf for leaf in spec]
        else:
            out.append(key)
    return out

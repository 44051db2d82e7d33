"""Multi-input models: a CNN per image key and the vector keys, concatenated, before the
algorithm's own network (what Stable-Baselines3's ``MultiInputPolicy`` does).

An env with a ``Dict`` (or ``Tuple``) observation space needs no ``--model`` of its own: every
algorithm builds the network it always builds (``--model mlp``, ``mlp-lstm``...; DQN's
Q-network, SAC's actor and critics, TRPO's actor-critic) on ``F`` features, behind a
:class:`MultiInputEncoder` that turns the observation's feature keys
(:mod:`rlstruct.blocks.obs_input`) into those ``F`` features:

================  ===========================================  =================================
kind              leaf                                         features
================  ===========================================  =================================
``image``         ``Box`` of 3 dims ``(C, H, W)``, uint8 or    a CNN, :data:`IMAGE_FEATURES`
                  float                                        (uint8 divided by 255 inside)
``vector``        any other ``Box``, ``MultiBinary``           flattened, as floats
``discrete``      ``Discrete(n)``                              one-hot, ``n`` features
================  ===========================================  =================================

An image's CNN has the Nature CNN's convolutions from 36x36 up, two stride-2 3x3 ones below
(its flatten size computed), then a linear layer to :data:`IMAGE_FEATURES` (ReLU).
``MultiDiscrete`` leaves are refused (:func:`spec_problems`), and so is a space of no feature
key. ``action_mask`` (:data:`~rlstruct.keys.ACTION_MASK`) is never a feature.

:class:`MultiInputModel` is ``encoder`` then ``inner``: ``forward(x, *args)`` is
``inner(encoder(x), *args)``, and so are ``value``, ``features`` and ``observe``; any other
attribute (``head``, ``state_size``, ``actor``...) is the inner network's. ``frozen=True``
(SAC's critic under the actor's loss) reads the encoder's weights detached too.
:func:`model_factory` is how an algorithm asks for its network: ``functools.partial(make,
*args)`` for one-array observations, the same call behind an encoder for a Dict; the factory
records plain values only, so a checkpoint rebuilds the model (``rlstruct evaluate``,
``rlstruct.load_policy``).

Example:
    >>> from gymnasium import spaces
    >>> import numpy as np
    >>> space = spaces.Dict({"image": spaces.Box(0, 255, (3, 16, 16), np.uint8),
    ...                      "vector": spaces.Box(-1, 1, (4,), np.float32)})
    >>> spec = obs_spec(space)
    >>> feature_size(spec)
    260
    >>> enc = MultiInputEncoder(spec)
    >>> enc({"image": torch.zeros(2, 3, 16, 16, dtype=torch.uint8),
    ...      "vector": torch.zeros(2, 4)}).shape
    torch.Size([2, 260])
"""

from __future__ import annotations

import functools
import importlib
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import torch
from gymnasium import spaces
from torch import Tensor, nn
from torch.func import functional_call

from rlstruct.blocks.nets import linear
from rlstruct.blocks.obs_input import is_feature_key
from rlstruct.envs.spaces import observation_leaves

__all__ = [
    "IMAGE_FEATURES", "obs_spec", "spec_problems", "feature_size", "MultiInputEncoder",
    "MultiInputModel", "multi_input", "model_factory",
]

#: The features of each image key's CNN.
IMAGE_FEATURES = 256
#: The smallest side the Nature CNN's convolutions take (8/4, 4/2, 3/1 leave 1x1 at 36).
_NATURE_MIN = 36
#: The methods of an inner network that read the observation first.
_OBS_METHODS = ("value", "features", "observe")


def spec_problems(space: gym.Space) -> list[str]:
    """What keeps a ``Dict``/``Tuple`` observation space from a multi-input model, as
    sentences naming the leaf (empty: nothing; a one-array space: nothing either)."""
    if not isinstance(space, (spaces.Dict, spaces.Tuple)):
        return []
    try:
        leaves = [lf for lf in observation_leaves(space) if is_feature_key(lf.key)]
    except Exception as err:  # noqa: BLE001 - the env layer's SpaceError, as a sentence
        return [str(err)]
    problems = [f"observation key {lf.key!r} is {lf.space}: a multi-input model takes Box "
                "(images (C, H, W) and vectors), MultiBinary and Discrete leaves; wrap the env "
                "to map it to a Box" for lf in leaves if isinstance(lf.space, spaces.MultiDiscrete)]
    if not leaves:
        problems.append(f"observation space {space} has no feature key (only 'action_mask')")
    return problems


def obs_spec(space: gym.Space) -> dict[str, dict[str, Any]] | None:
    """The plain-valued description of a ``Dict``/``Tuple`` observation space's feature keys,
    ``key -> {"kind": "image" | "vector" | "discrete", "shape": [...], "n": int}`` (``n``:
    features of a vector or classes of a discrete leaf), what :class:`MultiInputEncoder`
    takes; None for a one-array space (its model reads ``frame``).

    Raises:
        ValueError: the space has problems (:func:`spec_problems`).
    """
    if not isinstance(space, (spaces.Dict, spaces.Tuple)):
        return None
    problems = spec_problems(space)
    if problems:
        raise ValueError("; ".join(problems))
    spec: dict[str, dict[str, Any]] = {}
    for lf in observation_leaves(space):
        if not is_feature_key(lf.key):
            continue
        shape = list(lf.shape)
        if isinstance(lf.space, spaces.Discrete):
            spec[lf.key] = {"kind": "discrete", "shape": shape, "n": int(lf.space.n)}
        elif isinstance(lf.space, spaces.Box) and len(shape) == 3:
            spec[lf.key] = {"kind": "image", "shape": shape, "n": IMAGE_FEATURES}
        else:
            spec[lf.key] = {"kind": "vector", "shape": shape, "n": math.prod(shape)}
    return spec


def feature_size(spec: Mapping[str, Mapping[str, Any]]) -> int:
    """``F``, the encoder's features for ``spec`` (the sum of each key's ``n``)."""
    return sum(int(s["n"]) for s in spec.values())


def _image_cnn(channels: int, height: int, width: int) -> nn.Sequential:
    """A CNN ``(n, C, H, W) -> (n, IMAGE_FEATURES)`` whose flatten size fits ``(H, W)``."""
    if min(height, width) >= _NATURE_MIN:
        convs = [nn.Conv2d(channels, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
                 nn.Conv2d(64, 64, 3, 1), nn.ReLU()]
    else:
        convs = [nn.Conv2d(channels, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1),
                 nn.ReLU()]
    for layer in convs:
        if isinstance(layer, nn.Conv2d):
            nn.init.orthogonal_(layer.weight, math.sqrt(2))
            nn.init.zeros_(layer.bias)
    trunk = nn.Sequential(*convs, nn.Flatten())
    with torch.no_grad():
        n_flat = trunk(torch.zeros(1, channels, height, width)).shape[1]
    return nn.Sequential(trunk, linear(n_flat, IMAGE_FEATURES, math.sqrt(2)), nn.ReLU())


class MultiInputEncoder(nn.Module):
    """The feature keys of an observation -> ``(n, F)`` float features: a CNN per image key
    (uint8 divided by 255 here, not before), vectors flattened, discrete leaves one-hot, in
    ``spec``'s key order, concatenated.

    Args:
        spec: :func:`obs_spec` of the observation space.
    """

    def __init__(self, spec: Mapping[str, Mapping[str, Any]]) -> None:
        super().__init__()
        self.spec = {k: dict(v) for k, v in spec.items()}
        self.cnns = nn.ModuleList(_image_cnn(*s["shape"]) for s in self.spec.values()
                                  if s["kind"] == "image")
        self.n_features = feature_size(self.spec)

    def forward(self, x: Mapping[str, Tensor] | Tensor) -> Tensor:
        if isinstance(x, Tensor):  # a Dict of one leaf named "frame": model_input's tensor
            x = {next(iter(self.spec)): x}
        parts, cnns = [], iter(self.cnns)
        for key, s in self.spec.items():
            v = x[key]
            if s["kind"] == "image":
                pixels = v.float() / 255.0 if v.dtype == torch.uint8 else v.float()
                parts.append(next(cnns)(pixels))
            elif s["kind"] == "discrete":
                parts.append(nn.functional.one_hot(v.long(), int(s["n"])).float())
            else:
                parts.append(v.flatten(1).float())
        return torch.cat(parts, -1)


class MultiInputModel(nn.Module):
    """``inner(encoder(x), ...)``: an algorithm's network behind a :class:`MultiInputEncoder`
    (see the module doc).

    Args:
        encoder: the encoder of the observation's feature keys.
        inner: the network on its ``(n, F)`` features.
    """

    def __init__(self, encoder: MultiInputEncoder, inner: nn.Module) -> None:
        super().__init__()
        self.encoder, self.inner = encoder, inner

    def encode(self, x: Mapping[str, Tensor], frozen: bool = False) -> Tensor:
        """The ``(n, F)`` features of ``x``; ``frozen``: through detached encoder weights."""
        if not frozen:
            return self.encoder(x)
        weights = {k: v.detach() for k, v in self.encoder.named_parameters()}
        return functional_call(self.encoder, weights, (x,))

    def forward(self, x: Mapping[str, Tensor], *args: Any, **kwargs: Any) -> Any:
        return self.inner(self.encode(x, bool(kwargs.get("frozen", False))), *args, **kwargs)

    def forward_sequence(self, x: Mapping[str, Tensor] | Tensor, state: Tensor, starts: Tensor,
                         keep: Tensor) -> Any:
        """A recurrent inner network's whole segment (``forward_sequence`` of
        :class:`~rlstruct.blocks.zoo.RecurrentActorCritic`): the ``(B, T)`` observations
        encoded as one batch of ``B * T``, then ``inner.forward_sequence`` on their features
        ``(B, T, F)``."""
        b, n_t = starts.shape
        feats = self.encoder(x.flatten(0, 1)).view(b, n_t, -1)
        return self.inner.forward_sequence(feats, state, starts, keep)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in ("encoder", "inner") or name.startswith("__"):
                raise
        attr = getattr(self.inner, name)
        if name in _OBS_METHODS and callable(attr):
            return functools.partial(self._obs_method, attr)
        return attr

    def _obs_method(self, method: Callable[..., Any], x: Mapping[str, Tensor], *args: Any) -> Any:
        if method.__name__ == "observe":  # statistics of the features: no gradient
            with torch.no_grad():
                return method(self.encoder(x), *args)
        return method(self.encoder(x), *args)


def multi_input(make: str, spec: dict[str, dict[str, Any]], *args: Any,
                **kwargs: Any) -> MultiInputModel:
    """``make(*args, **kwargs)`` (``"module:name"``, built on ``F`` features) behind a
    :class:`MultiInputEncoder` of ``spec``: the constructor a checkpoint records."""
    module, _, name = make.partition(":")
    inner = getattr(importlib.import_module(module), name)(*args, **kwargs)
    return MultiInputModel(MultiInputEncoder(spec), inner)


def model_factory(spec: dict[str, dict[str, Any]] | None, make: Callable[..., nn.Module],
                  *args: Any, **kwargs: Any) -> Callable[..., nn.Module]:
    """The picklable factory of an algorithm's network: ``partial(make, *args, **kwargs)``
    when ``spec`` is None (one-array observations: exactly the call it always was), else
    :func:`multi_input` of it, whose ``args`` must then size the network's input by
    :func:`feature_size` (what ``Run.obs_shape`` and ``obs_dim`` are for a Dict space).

    Args:
        spec: :func:`obs_spec` of the observation space (``Run.obs_spec``), or None.
        make: a module-level class or function.
        *args: its positional arguments (plain values).
        **kwargs: its keyword arguments (plain values).
    """
    if spec is None:
        return functools.partial(make, *args, **kwargs)
    module = make.__module__
    if module == "__main__":  # python -m rlstruct.algos.sac: the module it was run as
        module = getattr(sys.modules["__main__"].__spec__, "name", module)
    return functools.partial(multi_input, f"{module}:{make.__qualname__}", spec, *args,
                             **kwargs)

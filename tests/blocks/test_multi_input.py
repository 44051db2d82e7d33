"""Dict observations (issue 42, item 2): the multi-input model, the keys it reads, the
trajectories' dtypes per key, and the two CPU batchers agreeing on a Dict env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstruct import DictTensor
from rlstruct import keys as K
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.multi_input import (
    IMAGE_FEATURES,
    MultiInputEncoder,
    MultiInputModel,
    feature_size,
    model_factory,
    obs_spec,
    spec_problems,
)
from rlstruct.blocks.obs_input import ObsInput, expand_inputs, input_keys, model_input
from rlstruct.blocks.sampling import PolicyAgent
from rlstruct.blocks.zoo import actor_critic
from rlstruct.envs import GymEnvInf
from rlstruct.envs.debug import DICT_ID, DictEnv

pytestmark = pytest.mark.timeout(120)

SPACE = DictEnv().observation_space
SPEC = obs_spec(SPACE)
F = feature_size(SPEC)


def _model(model: str = "mlp") -> torch.nn.Module:
    return model_factory(SPEC, actor_critic, model, (F,), space_spec(spaces.Discrete(2)), 16)()


def _obs(n: int) -> DictTensor:
    return DictTensor({"image": torch.randint(0, 256, (n, 3, 16, 16), dtype=torch.uint8),
                       "vector": torch.rand(n, 4), "reward": torch.zeros(n),
                       K.ACTION_MASK: torch.ones(n, 2, dtype=torch.bool)})


def test_the_spec_sizes_a_cnn_per_image_key_and_the_vectors_and_one_hot_discretes():
    space = spaces.Dict({"img": spaces.Box(0, 255, (3, 84, 84), np.uint8),
                         "small": spaces.Box(0.0, 1.0, (1, 5, 7), np.float32),
                         "v": spaces.Box(-1, 1, (2, 3), np.float32), "bits": spaces.MultiBinary(4),
                         "d": spaces.Discrete(5), K.ACTION_MASK: spaces.MultiBinary(3)})
    spec = obs_spec(space)
    assert K.ACTION_MASK not in spec  # never a model input
    assert {k: s["kind"] for k, s in spec.items()} == {
        "img": "image", "small": "image", "v": "vector", "bits": "vector", "d": "discrete"}
    assert feature_size(spec) == 2 * IMAGE_FEATURES + 6 + 4 + 5
    enc = MultiInputEncoder(spec)
    x = {"img": torch.zeros(3, 3, 84, 84, dtype=torch.uint8), "small": torch.rand(3, 1, 5, 7),
         "v": torch.rand(3, 2, 3), "bits": torch.ones(3, 4, dtype=torch.int8),
         "d": torch.tensor([0, 4, 2])}
    out = enc(x)
    assert out.shape == (3, feature_size(spec)) and out.dtype == torch.float32
    assert list(spec) == ["bits", "d", "img", "small", "v"]  # gymnasium's Dict sorts its keys
    assert out[:, 4:9].tolist() == torch.eye(5)[[0, 4, 2]].tolist()  # one-hot, after the bits
    assert out[:, :4].tolist() == [[1.0] * 4] * 3


def test_a_one_array_space_has_no_spec_and_its_model_input_is_the_frame_itself():
    assert obs_spec(spaces.Box(0, 1, (4,))) is None
    frame = torch.zeros(3, 4)
    assert model_input(DictTensor({"frame": frame, "reward": torch.zeros(3)})) is frame
    assert model_factory(None, actor_critic, "mlp", (4,), space_spec(spaces.Discrete(2)),
                         8)().__class__.__name__ == "HeadActorCritic"


def test_a_multi_discrete_leaf_or_no_feature_key_is_refused_with_the_key_named():
    (problem,) = spec_problems(spaces.Dict({"a": spaces.Box(0, 1, (2,)),
                                            "code": spaces.MultiDiscrete([2, 3])}))
    assert "'code'" in problem and "MultiDiscrete" in problem
    (problem,) = spec_problems(spaces.Dict({K.ACTION_MASK: spaces.MultiBinary(2)}))
    assert "no feature key" in problem
    with pytest.raises(ValueError, match="code"):
        obs_spec(spaces.Dict({"code": spaces.MultiDiscrete([2])}))


def test_the_model_input_skips_env_keys_and_the_action_mask_and_keeps_each_dtype():
    x = model_input(_obs(5))
    assert isinstance(x, ObsInput) and sorted(x) == ["image", "vector"]
    assert x["image"].dtype == torch.uint8 and x["vector"].dtype == torch.float32
    assert x[1:3]["image"].shape == (2, 3, 16, 16)
    steps = {"observation/image": 0, "observation/reward": 0, "observation/info/x": 0,
             "_observation/image": 0, "action/action": 0}
    assert input_keys(steps) == ["observation/image"]
    assert expand_inputs([K.OBS_FRAME, K.STORED_ACTION, K.NEXT_FRAME], SPEC) == [
        "observation/image", "observation/vector", "action/action", "_observation/image",
        "_observation/vector"]


@pytest.mark.parametrize("model", ["mlp", "mlp-lstm"])
def test_a_multi_input_model_gives_the_inner_models_shapes(model):
    net = _model(model)
    assert isinstance(net, MultiInputModel)
    x = model_input(_obs(6))
    if getattr(net, "state_size", 0):  # delegated to the inner network
        params, value, state = net(x, torch.zeros(6, net.state_size))
        assert state.shape == (6, net.state_size)
    else:
        params, value = net(x)
        assert net.value(x).shape == (6,)
    assert params.shape == (6, 2) and value.shape == (6,)
    assert net.head is net.inner.head


def test_uint8_images_reach_the_network_as_uint8_and_are_scaled_inside():
    net = _model()
    seen = {}
    net.encoder.register_forward_pre_hook(lambda m, args: seen.update(enc=args[0]["image"]))
    first_conv = net.encoder.cnns[0][0][0]
    first_conv.register_forward_pre_hook(lambda m, args: seen.update(conv=args[0]))
    agent = PolicyAgent(net)
    obs = _obs(4)
    agent(DictTensor(), obs, DictTensor())
    assert seen["enc"].dtype == torch.uint8 and seen["enc"].data_ptr() == obs["image"].data_ptr()
    assert seen["conv"].dtype == torch.float32 and float(seen["conv"].max()) <= 1.0


def test_frozen_reads_the_encoders_weights_detached():
    net = _model()
    out = net.inner.critic(net.encode(model_input(_obs(3)), frozen=True)).sum()
    out.backward()
    assert all(p.grad is None for p in net.encoder.parameters())
    assert any(p.grad is not None for p in net.inner.critic.parameters())


def _collect(cls: type, seeds: int = 7) -> DictTensor:
    torch.manual_seed(0)  # the same weights for both batchers
    args = (6, PolicyAgent, {"model": _model()}, GymEnvInf, {"env": DICT_ID, "n_envs": 2})
    with cls(*args, seeds=seeds) as b:  # Batcher: its worker process
        b.reset()
        b.execute()
        traj, _ = b.get()
    return traj.trajectories


@pytest.mark.slow
def test_the_trajectories_keep_each_keys_dtype_and_both_batchers_agree():
    serial = _collect(SerialBatcher)
    assert serial["observation/image"].dtype == torch.uint8
    assert serial["observation/image"].shape[2:] == (3, 16, 16)
    assert serial["observation/vector"].dtype == torch.float32
    assert serial["_observation/image"].dtype == torch.uint8
    assert gym.make(DICT_ID).observation_space == SPACE
    workers = _collect(Batcher)
    assert sorted(workers.keys()) == sorted(serial.keys())
    for k in serial:
        assert torch.equal(serial[k], workers[k]), k


def test_a_dict_leaf_named_frame_is_one_feature_key_among_the_others():
    space = spaces.Dict({"frame": spaces.Box(0, 255, (1, 8, 8), np.uint8),
                         "vector": spaces.Box(-1, 1, (2,), np.float32)})
    spec = obs_spec(space)
    obs = DictTensor({"frame": torch.zeros(3, 1, 8, 8, dtype=torch.uint8),
                      "vector": torch.zeros(3, 2), "reward": torch.zeros(3)})
    x = model_input(obs)
    assert isinstance(x, ObsInput) and sorted(x) == ["frame", "vector"]
    assert MultiInputEncoder(spec)(x).shape == (3, IMAGE_FEATURES + 2)
    alone = obs_spec(spaces.Dict({"frame": spaces.Box(0, 1, (3,), np.float32)}))
    frame = torch.zeros(4, 3)
    assert model_input(DictTensor({"frame": frame})) is frame  # one leaf: the tensor
    assert MultiInputEncoder(alone)(frame).shape == (4, 3)

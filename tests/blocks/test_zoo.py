"""The model zoo (rlstruct.blocks.zoo): every ``--model``'s shapes and state size, the CNNs'
uint8 frames divided by 255 inside, an LSTM's ``(h, c)`` side by side in one state, float32
heads under bfloat16 autocast, the sentences of ``model_problems``, ``actor_critic``'s
ValueError, and a factory partial that pickles and that a checkpoint records and rebuilds."""

from __future__ import annotations

import functools
import pickle
from functools import partial

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.nets import CNNActorCritic
from rlstruct.blocks.zoo import (
    MLP_OPTIONS,
    MODELS,
    RECURRENT_MODELS,
    Core,
    RecurrentActorCritic,
    actor_critic,
    is_recurrent,
    model_options,
    model_problems,
)
from rlstruct.runs import checkpoint as ckpt
from rlstruct.runs.contents import CheckpointContents

DISCRETE = space_spec(spaces.Discrete(3))
BOX = space_spec(spaces.Box(-1.0, 1.0, (2,), np.float32))
HIDDEN = 8
IMAGE = (4, 84, 84)
VECTOR = (5,)
#: ``state_size`` of each model with ``hidden = HIDDEN``: an MLP model has two towers (the
#: actor's and the critic's), an LSTM cell holds ``h`` and ``c``.
STATE_SIZES = {"mlp": 0, "cnn": 0, "mlp-lstm": 4 * HIDDEN, "mlp-gru": 2 * HIDDEN,
               "cnn-lstm": 2 * HIDDEN, "cnn-gru": HIDDEN}


def obs_shape(model: str) -> tuple[int, ...]:
    return IMAGE if model.startswith("cnn") else VECTOR


def frames(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, *IMAGE), generator=g, dtype=torch.uint8)


def observations(model: str, n: int, seed: int = 0) -> torch.Tensor:
    if model.startswith("cnn"):
        return frames(n, seed)
    return torch.randn(n, *VECTOR, generator=torch.Generator().manual_seed(seed))


@functools.cache
def _build(model: str, space: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return actor_critic(model, obs_shape(model), BOX if space == "box" else DISCRETE, HIDDEN)


def build(model: str, space: str = "discrete") -> torch.nn.Module:
    """The model, built once per module (an orthogonal 3136x512 layer takes a while); no test
    changes its weights."""
    return _build(model, space)


def run(net: torch.nn.Module, x: torch.Tensor, state: torch.Tensor | None = None) -> tuple:
    """``(params, value[, state'])``: a recurrent model from ``state`` (zeros by default)."""
    if not is_recurrent(net):
        return net(x)
    if state is None:
        state = torch.zeros(x.shape[0], net.state_size)
    return net(x, state)


def test_the_zoo_lists_every_model_and_its_recurrent_ones():
    assert MODELS == ("mlp", "cnn", "mlp-lstm", "mlp-gru", "cnn-lstm", "cnn-gru")
    assert set(RECURRENT_MODELS) == {m for m in MODELS if STATE_SIZES[m] > 0}


@pytest.mark.parametrize("model", MODELS)
def test_every_model_gives_params_value_and_state_of_its_shapes(model):
    net = build(model)
    assert is_recurrent(net) == (model in RECURRENT_MODELS)
    assert getattr(net, "state_size", 0) == STATE_SIZES[model]
    out = run(net, observations(model, 5))
    params, value = out[0], out[1]
    assert params.shape == (5, 3) and value.shape == (5,)
    assert net.head.sample(params).shape == (5,)
    if is_recurrent(net):
        assert isinstance(net, RecurrentActorCritic) and len(out) == 3
        assert out[2].shape == (5, STATE_SIZES[model])
        assert torch.equal(net.value(observations(model, 5), torch.zeros(5, net.state_size)),
                           value)
    else:
        assert len(out) == 2
        assert torch.equal(net.value(observations(model, 5)), value)


@pytest.mark.parametrize("model", ["mlp", "mlp-lstm", "mlp-gru"])
def test_the_mlp_models_take_a_box_action_space(model):
    net = build(model, "box")
    params = run(net, observations(model, 4))[0]
    assert params.shape == (4, 4)  # a Gaussian's mean and log-std for 2 actions
    assert net.head.sample(params).shape == (4, 2)


@pytest.mark.parametrize("model", ["cnn", "cnn-lstm", "cnn-gru"])
def test_the_cnn_models_take_uint8_frames_and_divide_them_by_255_inside(model):
    net = build(model)
    x = frames(3)
    params, value = run(net, x)[:2]
    # The same pixels as floats give the same outputs (the division is the model's) ...
    as_float = run(net, x.float())
    assert torch.equal(as_float[0], params) and torch.equal(as_float[1], value)
    # ... and frames scaled to [0, 1] by the caller are divided a second time: other outputs.
    scaled = run(net, x.float() / 255.0)
    assert not torch.allclose(scaled[1], value)
    # The trunk sees pixels / 255.
    trunk = net.trunk if isinstance(net, CNNActorCritic) else net.towers[0].encoder
    features = trunk(x.float() / 255.0)
    if isinstance(net, CNNActorCritic):
        assert torch.equal(net.critic(features).squeeze(-1), value)
    else:
        h, _ = net.towers[0].core(features, torch.zeros(3, net.state_size))
        assert torch.equal(net.critic(h).squeeze(-1), value)


def test_an_lstm_state_is_h_then_c_and_a_step_from_zeros_is_the_lstm_cells():
    net = build("cnn-lstm")
    x = frames(4)
    _, _, state = net(x, torch.zeros(4, net.state_size))
    features = net.towers[0].encoder(x.float() / 255.0)
    h, c = net.towers[0].core.cell(features)  # nn.LSTMCell from its own zero state
    assert torch.equal(state, torch.cat([h, c], -1))
    # From a non-zero state: h then c, fed back as the cell's (h, c).
    h2, c2 = net.towers[0].core.cell(features, (h, c))
    _, _, state2 = net(x, state)
    torch.testing.assert_close(state2, torch.cat([h2, c2], -1))


def test_an_mlp_lstm_holds_the_actors_h_c_then_the_critics():
    net = build("mlp-lstm")
    x = observations("mlp-lstm", 4)
    params, value, state = net(x, torch.zeros(4, net.state_size))
    expected = []
    for tower in net.towers:
        encoded = tower.encoder(x)
        h, c = tower.core.cell(encoded)
        expected.append((encoded, h, c))
    assert torch.equal(state, torch.cat([t for _, h, c in expected for t in (h, c)], -1))
    (enc_a, h_a, _), (enc_c, h_c, _) = expected
    assert torch.equal(params, net.actor(torch.cat([enc_a, h_a], -1)))  # the skip: [x, h]
    assert torch.equal(value, net.critic(torch.cat([enc_c, h_c], -1)).squeeze(-1))


def test_a_gru_state_is_its_h_and_the_state_changes_the_outputs():
    net = build("mlp-gru")
    x = observations("mlp-gru", 4)
    zero = torch.zeros(4, net.state_size)
    params, value, state = net(x, zero)
    h_actor = net.towers[0].core.cell(net.towers[0].encoder(x))
    assert torch.equal(state[:, :HIDDEN], h_actor)
    params2, value2, _ = net(x, state)  # the same observation under another memory
    assert not torch.allclose(value2, value) and not torch.allclose(params2, params)


def test_core_refuses_another_cell():
    with pytest.raises(ValueError, match=r"kind must be one of \('lstm', 'gru'\), got 'rnn'"):
        Core("rnn", 3, 4)


@pytest.mark.parametrize("model", ["cnn", "cnn-lstm", "cnn-gru", "mlp-lstm"])
def test_the_heads_stay_float32_under_bf16_autocast(model):
    net = build(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(net, observations(model, 2))
    assert [t.dtype for t in out] == [torch.float32] * len(out)


def test_model_problems_name_the_model_and_what_it_takes():
    assert model_problems("mlp", (4,), "CartPole-v1") == []
    assert model_problems("cnn-lstm", IMAGE, "ALE/Pong-v5") == []
    assert model_problems("cnn", None, "CartPole-v1") == []  # the shape not known yet
    (problem,) = model_problems("cnn", (4,), "CartPole-v1")
    assert problem == ("--model cnn takes image frames (C, H, W), but CartPole-v1's observations "
                       "are (4,): use --model mlp, or an Atari env with --env-backend atari")
    (problem,) = model_problems("cnn-gru", (2,), "rlstruct/CartPoleNoVel-v1")
    assert problem.startswith("--model cnn-gru takes image frames")
    assert "rlstruct/CartPoleNoVel-v1's observations are (2,)" in problem
    # Frames of another size than the Nature CNN's (CarRacing's are (96, 96, 3)): said now,
    # not as a matrix-shape error inside the first forward.
    (problem,) = model_problems("cnn", (96, 96, 3), "CarRacing-v3")
    assert problem == ("--model cnn takes frames (C, 84, 84), the Nature CNN's input, but "
                       "CarRacing-v3's observations are (96, 96, 3): use an Atari env with "
                       "--env-backend atari (84x84 frames, channels first), or resize the frames")
    assert model_problems("cnn-gru", (1, 84, 84), "ALE/Pong-v5") == []
    (problem,) = model_problems("transformer", (4,), "CartPole-v1")
    assert problem == f"--model 'transformer' is not one of this algorithm's models {MODELS}"
    (problem,) = model_problems("mlp-lstm", (4,), "CartPole-v1", allowed=("mlp", "cnn"))
    assert problem == "--model 'mlp-lstm' is not one of this algorithm's models ('mlp', 'cnn')"


def test_actor_critic_refuses_an_unknown_model_and_misplaced_options():
    with pytest.raises(ValueError, match=r"model must be one of .*'mlp'.*got 'lstm'"):
        actor_critic("lstm", VECTOR, DISCRETE, HIDDEN)
    with pytest.raises(ValueError, match=r"options \['activation'\] apply to --model mlp "
                                         r"only, not mlp-gru"):
        actor_critic("mlp-gru", VECTOR, DISCRETE, HIDDEN, activation="relu", normalize_obs=True)
    with pytest.raises(ValueError, match=r"options \['normalize_obs'\] apply to --model mlp "
                                         r"only, not cnn-gru"):
        actor_critic("cnn-gru", IMAGE, DISCRETE, HIDDEN, normalize_obs=True)
    net = actor_critic("mlp", VECTOR, DISCRETE, HIDDEN, normalize_obs=True)  # mlp takes them
    assert not is_recurrent(net)
    assert model_options("mlp") == MLP_OPTIONS and model_options("cnn-lstm") == ()
    with pytest.raises(ValueError, match=r"--model cnn takes a Discrete action space, got "
                                         r"Box\(.*use cnn-lstm or cnn-gru"):
        actor_critic("cnn", IMAGE, BOX, HIDDEN)
    assert actor_critic("cnn-gru", IMAGE, BOX, HIDDEN).head.sample(
        torch.zeros(1, 4)).shape == (1, 2)  # the recurrent CNNs' heads take a Box


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_a_recurrent_mlp_normalises_observations_with_the_statistics_it_was_shown(core):
    """``--normalize-obs`` for mlp-lstm and mlp-gru (rl-zoo's recurrent PPO runs under
    VecNormalize): ``observe`` moves the statistics, ``forward`` never does, and the model
    reads ``(x - mean) / std``: the same outputs as a plain model fed normalised inputs."""
    torch.manual_seed(0)
    normed = actor_critic(f"mlp-{core}", VECTOR, DISCRETE, HIDDEN, normalize_obs=True,
                          normalize_reward=True)
    plain = actor_critic(f"mlp-{core}", VECTOR, DISCRETE, HIDDEN)
    plain.load_state_dict(normed.state_dict(), strict=False)  # the same weights
    seen = 3.0 + 5.0 * torch.randn(256, *VECTOR)
    state = torch.randn(4, normed.state_size)
    x = seen[:4]
    before = normed(x, state)  # no statistics yet: the identity, clipped to +-10
    assert all(torch.equal(a, b) for a, b in
               zip(before, plain(x.clamp(-10, 10), state), strict=True))
    normed.observe(seen)
    assert normed.obs_norm.count.item() == 256 and normed.reward_norm is not None
    normed(x, state)  # forward leaves the statistics alone
    assert normed.obs_norm.count.item() == 256
    scaled = (x - seen.mean(0)) / seen.var(0, unbiased=False).sqrt()
    for a, b in zip(normed(x, state), plain(scaled, state), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert "obs_norm.mean" in normed.state_dict()  # they travel with the weights
    with pytest.raises(ValueError, match="normalize_obs and normalize_reward take an MLP torso"):
        RecurrentActorCritic(IMAGE, DISCRETE, HIDDEN, cnn=True, normalize_obs=True)


def test_the_nature_cnn_reads_84x84_frames_only():
    """Why model_problems asks for (C, 84, 84): other frames fail inside the forward."""
    net = build("cnn-lstm")
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        net(torch.zeros(1, 4, 96, 96, dtype=torch.uint8), torch.zeros(1, net.state_size))


@pytest.mark.parametrize("model", ["mlp", "mlp-lstm"])
def test_the_factory_partial_pickles_and_a_checkpoint_records_and_rebuilds_it(model, tmp_path):
    factory = partial(actor_critic, model, obs_shape(model), DISCRETE, HIDDEN)
    again = pickle.loads(pickle.dumps(factory))  # what learner ranks and workers receive
    assert again.func is actor_critic and again.args == factory.args
    contents = CheckpointContents({}, None)
    net = contents.model(factory)
    contents.add(model=net)
    state = contents.state()
    spec = state["constructors"]["model"]
    assert spec == {"class": "rlstruct.blocks.zoo:actor_critic",
                    "args": [model, obs_shape(model), DISCRETE, HIDDEN], "kwargs": {}}
    ckpt.save_checkpoint(state, tmp_path / "latest.pt")
    loaded = ckpt.load_checkpoint(tmp_path / "latest.pt")  # weights_only: plain values only
    rebuilt = ckpt.build_model(loaded["constructors"]["model"])
    rebuilt.load_state_dict(loaded["model"])
    x = observations(model, 3)
    for a, b in zip(run(net, x), run(rebuilt, x), strict=True):
        assert torch.equal(a, b)

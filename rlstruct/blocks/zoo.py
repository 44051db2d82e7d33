"""The model zoo: one place where every algorithm gets its actor-critic (``--model``).

=============  ==========================================================================
``--model``    the network
=============  ==========================================================================
``mlp``        separate actor and critic MLPs on flattened observations
               (:class:`~rlstruct.blocks.nets.HeadActorCritic`)
``cnn``        the Nature CNN on stacked uint8 frames ``(C, 84, 84)``, divided by 255
               inside, with actor and critic heads on its 512 features
               (:class:`~rlstruct.blocks.nets.CNNActorCritic`)
``mlp-lstm``   a recurrent actor and a recurrent critic: each a tanh encoder, an LSTM
``mlp-gru``    (or GRU) cell, and its head over ``[encoding, memory]``
``cnn-lstm``   the Nature CNN, one LSTM (or GRU) cell over its features, and actor and
``cnn-gru``    critic heads on the cell's output (CleanRL's ``ppo_atari_lstm`` network)
=============  ==========================================================================

Feed-forward models are ``forward(frame) -> (params (n, P), value (n,))``. Recurrent ones
(:class:`RecurrentActorCritic`) are ``forward(frame, state (n, S)) -> (params, value,
state')`` with ``state_size = S``: an LSTM's ``(h, c)`` (and the two towers of an MLP model)
are one tensor side by side, so a batcher stores it as ``agent_state/h`` and ``replay_agent``
restarts from it (:mod:`rlstruct.blocks.recurrent` has the agent).

Examples:
    >>> from gymnasium import spaces
    >>> from rlstruct.blocks.distributions import space_spec
    >>> net = actor_critic("mlp-lstm", (3,), space_spec(spaces.Discrete(2)), 16)
    >>> state = torch.zeros(5, net.state_size)
    >>> params, value, state = net(torch.zeros(5, 3), state)
    >>> params.shape, value.shape, state.shape, is_recurrent(net)
    (torch.Size([5, 2]), torch.Size([5]), torch.Size([5, 64]), True)
    >>> is_recurrent(actor_critic("mlp", (3,), space_spec(spaces.Discrete(2)), 16))
    False
"""

from __future__ import annotations

import itertools
import math

import torch
from gymnasium.spaces import Discrete, Space
from torch import Tensor, nn

from rlstruct.blocks.distributions import ActionHead, make_head, space_from_spec
from rlstruct.blocks.nets import (
    CNNActorCritic,
    head_actor_critic,
    linear,
    nature_cnn,
    scaled_pixels,
)
from rlstruct.blocks.normalization import RunningNorm

__all__ = [
    "MODELS", "RECURRENT_MODELS", "MLP_OPTIONS", "RECURRENT_MLP_OPTIONS", "CORES", "Core",
    "RecurrentActorCritic", "actor_critic", "is_recurrent", "model_options", "model_problems",
]

#: The shortest run of steps :meth:`Core.sequence` hands to torch's fused LSTM (GRU): its
#: call costs about four cell steps on the CPU (torch 2.13, 2 cores).
FUSED_MIN_STEPS = 8

#: Every ``--model`` of the actor-critic algorithms.
MODELS = ("mlp", "cnn", "mlp-lstm", "mlp-gru", "cnn-lstm", "cnn-gru")
#: The recurrent ones (their state travels as ``agent_state``).
RECURRENT_MODELS = ("mlp-lstm", "mlp-gru", "cnn-lstm", "cnn-gru")
#: The options of ``--model mlp`` (:func:`~rlstruct.blocks.nets.head_actor_critic`'s).
MLP_OPTIONS = ("log_std_init", "normalize_obs", "activation", "normalize_reward", "init")
#: Those an MLP-torso recurrent model takes too (:class:`RecurrentActorCritic`).
RECURRENT_MLP_OPTIONS = ("normalize_obs", "normalize_reward")
#: The recurrent cells.
CORES = ("lstm", "gru")
#: The frame size ``(H, W)`` of the Nature CNN (its last layer reads 7x7 feature maps).
_NATURE_FRAME = (84, 84)


def model_options(model: str) -> tuple[str, ...]:
    """The options of :data:`MLP_OPTIONS` that ``--model model`` takes: all for ``mlp``,
    :data:`RECURRENT_MLP_OPTIONS` for ``mlp-lstm`` and ``mlp-gru``, none for the CNNs."""
    return (MLP_OPTIONS if model == "mlp" else
            RECURRENT_MLP_OPTIONS if model.startswith("mlp-") else ())


def is_recurrent(model: nn.Module) -> bool:
    """Whether ``model`` carries a state (``state_size > 0``)."""
    return getattr(model, "state_size", 0) > 0


def model_problems(model: str, obs_shape: tuple[int, ...] | None, env_id: str,
                   allowed: tuple[str, ...] = MODELS) -> list[str]:
    """What is wrong with ``--model model`` for observations ``obs_shape`` (``None``: not
    known yet), as sentences; empty when nothing is."""
    if model not in allowed:
        return [f"--model {model!r} is not one of this algorithm's models {allowed}"]
    if obs_shape is None or not model.startswith("cnn"):
        return []
    if len(obs_shape) != 3:
        return [f"--model {model} takes image frames (C, H, W), but {env_id}'s observations "
                f"are {tuple(obs_shape)}: use --model mlp, or an Atari env with "
                "--env-backend atari"]
    if tuple(obs_shape[1:]) != _NATURE_FRAME:
        return [f"--model {model} takes frames (C, 84, 84), the Nature CNN's input, but "
                f"{env_id}'s observations are {tuple(obs_shape)}: use an Atari env with "
                "--env-backend atari (84x84 frames, channels first), or resize the frames"]
    return []


class Core(nn.Module):
    """An LSTM or GRU cell whose state is one tensor: ``forward(x (n, F), state (n, S)) ->
    (out (n, H), state' (n, S))``; ``S = 2 H`` for an LSTM (``h`` then ``c``), ``H`` for a
    GRU. Orthogonal weights, zero biases (CleanRL's LSTM initialisation)."""

    def __init__(self, kind: str, n_in: int, hidden: int) -> None:
        super().__init__()
        if kind not in CORES:
            raise ValueError(f"kind must be one of {CORES}, got {kind!r}")
        self.kind, self.hidden = kind, hidden
        self.cell = nn.LSTMCell(n_in, hidden) if kind == "lstm" else nn.GRUCell(n_in, hidden)
        self.state_size = 2 * hidden if kind == "lstm" else hidden
        for name, p in self.cell.named_parameters():
            if name.startswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.orthogonal_(p, 1.0)

    def forward(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        state = state.to(x.dtype)
        if self.kind == "gru":
            h = self.cell(x, state)
            return h, h
        h, c = self.cell(x, tuple(state.chunk(2, -1)))
        return h, torch.cat([h, c], -1)

    def sequence(self, x: Tensor, state: Tensor, starts: Tensor,
                 keep: Tensor) -> tuple[Tensor, Tensor]:
        """``T`` steps of :meth:`forward` at once, the state restarted from zeros before step
        ``t`` where ``starts[:, t]``.

        The steps are cut into runs at every restart and after every step in ``keep``; a run
        of :data:`FUSED_MIN_STEPS` steps or more goes through torch's fused LSTM (GRU) over
        the cell's own weights (one call, an order of magnitude faster than a Python loop of
        cells on the CPU: the same maths, to float rounding), a shorter one through the cell.

        Args:
            x: inputs ``(B, T, F)``.
            state: the state ``(B, S)`` before the first step.
            starts: ``(B, T)`` bool, true where the state restarts from zeros.
            keep: ``(B, T)`` bool, the steps whose whole state is wanted.

        Returns:
            ``(out (B, T, H), states (B, T, S))``: the output and the state after each step.
            A GRU's state is its output, whole at every step; an LSTM's cell half ``c`` is
            whole after the steps in ``keep`` and after each run, NaN after the other steps
            of a fused run (torch's fused LSTM gives only its last ``c``).
        """
        state = state.to(x.dtype)
        cut = starts.any(0)
        cut[1:] |= keep.any(0)[:-1]
        cut[0] = True
        bounds = [*cut.nonzero().flatten().tolist(), x.shape[1]]
        outs, states = [], []
        for t0, t1 in itertools.pairwise(bounds):
            state = state.masked_fill(starts[:, t0, None], 0.0)
            out, run_states = (self._fused if t1 - t0 >= FUSED_MIN_STEPS else self._stepped)(
                x[:, t0:t1], state)
            outs.append(out)
            states.append(run_states)
            state = run_states[:, -1]
        return torch.cat(outs, 1), torch.cat(states, 1)

    def _stepped(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        outs, states = [], []
        for t in range(x.shape[1]):
            out, state = self(x[:, t], state)
            outs.append(out)
            states.append(state)
        return torch.stack(outs, 1), torch.stack(states, 1)

    def _fused(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        c = self.cell
        weights = [c.weight_ih, c.weight_hh, c.bias_ih, c.bias_hh]
        if self.kind == "gru":
            out, _ = torch.gru(x, state.unsqueeze(0).contiguous(), weights, True, 1, 0.0,
                               self.training, False, True)
            return out, out
        h0, c0 = (part.unsqueeze(0).contiguous() for part in state.chunk(2, -1))
        out, _, c_last = torch.lstm(x, (h0, c0), weights, True, 1, 0.0, self.training, False,
                                    True)
        cells = torch.cat([torch.full_like(out[:, 1:], float("nan")),
                           c_last.squeeze(0).unsqueeze(1)], 1)
        return out, torch.cat([out, cells], -1)


class _Tower(nn.Module):
    """``encoder -> core``; the output is ``[encoding, memory]`` with ``skip`` (the current
    observation reaches the head directly), else the memory alone."""

    def __init__(self, encoder: nn.Module, n_features: int, core: str, hidden: int,
                 skip: bool) -> None:
        super().__init__()
        self.encoder, self.core, self.skip = encoder, Core(core, n_features, hidden), skip
        self.n_out = n_features + hidden if skip else hidden

    def forward(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        x = self.encoder(x)
        with torch.autocast(x.device.type, enabled=False):  # the cell in float32
            x = x.float()
            h, state = self.core(x, state)
        return (torch.cat([x, h], -1) if self.skip else h), state

    def sequence(self, x: Tensor, state: Tensor, starts: Tensor,
                 keep: Tensor) -> tuple[Tensor, Tensor]:
        """``x`` ``(B * T, *in)`` encoded in one batch, then :meth:`Core.sequence` through
        ``T`` steps; returns ``(out (B * T, n_out), states after each step (B, T, S))``."""
        b, n_t = starts.shape
        x = self.encoder(x)
        with torch.autocast(x.device.type, enabled=False):  # the cell in float32
            x = x.float()
            h, states = self.core.sequence(x.view(b, n_t, -1), state, starts, keep)
            h = h.flatten(0, 1)
        return (torch.cat([x, h], -1) if self.skip else h), states


class RecurrentActorCritic(nn.Module):
    """A recurrent actor-critic: ``forward(frame, state (n, S)) -> (params (n, P), value (n,),
    state' (n, S))``, ``value(frame, state) -> (n,)``; ``state_size = S``, zeros at an
    episode's start.

    With ``cnn``, frames are uint8 ``(n, C, H, W)`` through one Nature CNN (divided by 255)
    and one cell; actor and critic heads read the cell's output. Without, flattened float
    observations go through two towers, the actor's and the critic's, each a tanh encoder and
    a cell with a skip (a shared torso would let the value loss's gradients drown the
    policy's); their states lie side by side.

    An MLP model may normalise its observations (``normalize_obs``: ``self.obs_norm``, updated
    by the learner through :meth:`observe`, never by ``forward``) and keep the statistics by
    which an algorithm scales rewards (``normalize_reward``: ``self.reward_norm``), as
    :class:`~rlstruct.blocks.nets.HeadActorCritic` does: rl-zoo's recurrent PPO runs under
    ``VecNormalize``. The statistics are buffers, so they travel with the weights.

    Args:
        obs_shape: one observation's shape.
        action_space: the action space (or its ``space_spec``).
        hidden: the encoder's width (MLP) and the cell's state width.
        core: ``"lstm"`` or ``"gru"``.
        cnn: the Nature CNN encoder.
        normalize_obs: MLP only: normalise observations with running statistics.
        normalize_reward: MLP only: keep running statistics of the discounted returns.

    Raises:
        ValueError: ``normalize_obs`` or ``normalize_reward`` with ``cnn``.
    """

    def __init__(self, obs_shape: tuple[int, ...], action_space: Space | dict[str, object],
                 hidden: int, core: str = "lstm", cnn: bool = False,
                 normalize_obs: bool = False, normalize_reward: bool = False) -> None:
        super().__init__()
        if cnn and (normalize_obs or normalize_reward):
            raise ValueError("normalize_obs and normalize_reward take an MLP torso, not the CNN "
                             "(its uint8 frames are divided by 255 inside)")
        self.cnn = cnn
        self.obs_norm = RunningNorm((math.prod(obs_shape),)) if normalize_obs else None
        self.reward_norm = RunningNorm((1,), clip=0.0) if normalize_reward else None
        space = space_from_spec(action_space)
        if cnn:
            towers = [_Tower(nature_cnn(obs_shape[0]), 512, core, hidden, skip=False)]
        else:
            obs_dim = math.prod(obs_shape)
            towers = [
                _Tower(nn.Sequential(linear(obs_dim, hidden, math.sqrt(2)), nn.Tanh()),
                       hidden, core, hidden, skip=True)
                for _ in range(2)
            ]
        self.towers = nn.ModuleList(towers)
        self.actor = make_head(space, towers[0].n_out)
        self.critic = linear(towers[-1].n_out, 1, 1.0)
        self._sizes = [t.core.state_size for t in towers]
        self.state_size = sum(self._sizes)

    @property
    def head(self) -> ActionHead:
        """The policy head (its params are the logits of a categorical one)."""
        return self.actor

    def observe(self, frame: Tensor) -> None:
        """Merges observations ``(N, *obs)`` (a batch's valid steps) into the running
        statistics; nothing without ``normalize_obs``."""
        if self.obs_norm is not None:
            self.obs_norm.update(frame.flatten(1).float())

    def _inputs(self, frame: Tensor) -> Tensor:
        x = scaled_pixels(frame) if self.cnn else frame.flatten(1).float()
        return x if self.obs_norm is None else self.obs_norm(x)

    def _heads(self, outs: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        with torch.autocast(outs[0].device.type, enabled=False):  # the heads in float32
            return self.actor(outs[0].float()), self.critic(outs[-1].float()).squeeze(-1)

    def forward(self, frame: Tensor, state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = self._inputs(frame)
        outs, states = zip(*(tower(x, s) for tower, s in
                             zip(self.towers, state.split(self._sizes, -1), strict=True)))
        return *self._heads(outs), torch.cat(states, -1)

    def forward_sequence(self, frames: Tensor, state: Tensor, starts: Tensor,
                         keep: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """A whole segment at once: what ``T`` calls of ``forward`` give (to float rounding),
        the state restarted from zeros before step ``t`` where ``starts[:, t]``, with every
        step's encoder (the CNN) run as one batch of ``B * T`` and the cell's steps fused
        (:meth:`Core.sequence`).

        Args:
            frames: observations ``(B, T, *obs)``.
            state: the state ``(B, S)`` before the first step.
            starts: ``(B, T)`` bool, true where an episode starts (the state restarts).
            keep: ``(B, T)`` bool, the steps whose whole state is wanted (a bootstrap's).

        Returns:
            ``(params (B, T, P), value (B, T), states (B, T, S))``, the state after each step
            (an LSTM's cell half whole only after the steps in ``keep``: :meth:`Core.sequence`).
        """
        b, n_t = starts.shape
        x = self._inputs(frames.flatten(0, 1))
        outs, states = zip(*(tower.sequence(x, s, starts, keep) for tower, s in
                             zip(self.towers, state.split(self._sizes, -1), strict=True)))
        params, value = self._heads(outs)
        return params.view(b, n_t, -1), value.view(b, n_t), torch.cat(states, -1)

    def value(self, frame: Tensor, state: Tensor) -> Tensor:
        """``V(frame)`` under ``state``, ``(n,)``."""
        return self(frame, state)[1]


def actor_critic(model: str, obs_shape: tuple[int, ...], action_space: Space | dict[str, object],
                 hidden: int, **mlp_options: object) -> nn.Module:
    """The actor-critic ``--model model`` names (see the module doc), from plain values only,
    so that a checkpoint records the call and ``rlstruct evaluate`` repeats it.

    Args:
        model: one of :data:`MODELS`.
        obs_shape: one observation's shape (``(C, H, W)`` for a CNN).
        action_space: the action space, or its ``space_spec``.
        hidden: the MLPs' width, or the recurrent cell's.
        **mlp_options: passed to :func:`~rlstruct.blocks.nets.head_actor_critic` for ``mlp``
            (``normalize_obs``, ``activation``, ``log_std_init``...); ``mlp-lstm`` and
            ``mlp-gru`` take :data:`RECURRENT_MLP_OPTIONS`.

    Raises:
        ValueError: ``model`` is not one of :data:`MODELS`, ``mlp_options`` are given that
            ``model`` does not take, or ``cnn`` is given another action space than a
            ``Discrete`` one.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    if model != "mlp" and (wrong := sorted(set(mlp_options) - set(model_options(model)))):
        raise ValueError(f"options {wrong} apply to --model mlp only, not {model}")
    if model == "mlp":
        return head_actor_critic(math.prod(obs_shape), action_space, hidden,
                                 **mlp_options)  # type: ignore[arg-type]
    if model == "cnn":
        space = space_from_spec(action_space)
        if not isinstance(space, Discrete):
            raise ValueError(f"--model cnn takes a Discrete action space, got {space}: use "
                             "cnn-lstm or cnn-gru, whose heads take any action space")
        return CNNActorCritic(int(space.n), in_channels=obs_shape[0])
    torso, core = model.split("-")
    return RecurrentActorCritic(obs_shape, action_space, hidden, core, cnn=torso == "cnn",
                                **mlp_options)  # type: ignore[arg-type]

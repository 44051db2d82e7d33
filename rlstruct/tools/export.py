"""``rlstruct export RUN_DIR --format onnx|torchscript``: a run's greedy policy as one file that
runs without rlstruct.

:func:`export_policy` loads the run's policy (:func:`rlstruct.load_policy`), wraps its agent's
model in a :class:`GreedyPolicy` (observation in; greedy action and the head's outputs out),
records it with ``torch.onnx.export`` or ``torch.jit.trace``, checks the file against the agent
on sampled observations, and moves it into place (a failed export leaves no file). The file
holds the weights and every step from the observation to the action: an ONNX file runs with
``onnxruntime`` alone, a TorchScript file with ``torch.jit.load`` alone.

Inputs and outputs, by name (an ONNX graph's input and output names; a TorchScript module's
``forward`` arguments and the tuple it returns, in this order):

==============  ===========================================  ======================================
name            shape, dtype                                 holds
==============  ===========================================  ======================================
``obs``         ``(batch, *obs_shape)``, the env's dtype     observations as the env returns them
                                                             (uint8 frames stay uint8)
``state``       ``(batch, S)`` float32                       recurrent models only: the memory,
                                                             zeros at an episode's start
``action``      ``(batch,)`` int64 (Discrete), or            the greedy action, as the env takes
                ``(batch, D)`` in the Box's dtype            it (what ``Policy.act`` plays)
``logits``      ``(batch, A)`` float32                       a categorical head's logits
``mean``        ``(batch, D)`` float32                       a Gaussian head's mean, in its
                                                             normalised space (``action`` is it
                                                             rescaled to the Box and clipped;
                                                             SAC's: squashed by tanh first)
``q_values``    ``(batch, A)`` float32                       DQN's Q values (``action``: argmax)
``next_state``  ``(batch, S)`` float32                       recurrent models only: the memory to
                                                             pass as ``state`` at the next step
==============  ===========================================  ======================================

Each file also says this in JSON (:func:`signature` of the module: names, shapes, dtypes, the
run's algorithm, env and frames): ONNX in its ``metadata_props`` under the key ``rlstruct``,
TorchScript in the extra file ``signature.json`` (``torch.jit.load(path, _extra_files=...)``).

ONNX is written by torch's TorchScript-based exporter (``dynamo=False``): it takes a fraction of
a second and needs no ``onnxscript``, and the policies are straight-line tensor code, which a
trace records whole; torch 2.13's ``torch.export``-based exporter takes several seconds and
needs ``onnxscript``. The batch axis is dynamic in both formats (a trace records no batch size:
the check runs another batch size than the trace's).

Example (shell)::

    rlstruct export runs/ppo_CartPole-v1_20261125-101500 --format onnx
    # runs/ppo_CartPole-v1_20261125-101500/policy.onnx: obs (batch, 4) float32 -> action ...
"""

from __future__ import annotations

import contextlib
import copy as copy_module
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rlstruct import keys as K
from rlstruct.blocks.distributions import CategoricalHead, GaussianHead
from rlstruct.blocks.zoo import is_recurrent
from rlstruct.envs.spaces import observation_leaves, torch_dtype
from rlstruct.errors import CheckpointError, ConfigError, install_hint
from rlstruct.runs.policy import Policy, load_policy

__all__ = ["FORMATS", "DEFAULT_NAMES", "METADATA_KEY", "GreedyPolicy", "greedy_module",
           "signature", "export_policy", "write_policy", "read_signature", "describe"]

#: The formats of ``--format``.
FORMATS = ("onnx", "torchscript")
#: The file written into the run folder when no ``--out`` is given.
DEFAULT_NAMES = {"onnx": "policy.onnx", "torchscript": "policy.pt"}
#: The key of the JSON signature in an ONNX file's metadata (TorchScript: ``signature.json``).
METADATA_KEY = "rlstruct"
#: The ONNX opset written (onnxruntime has run it since 1.12).
OPSET = 17
#: Rows of the trace's example batch, and of the check's (another size: a batch size baked
#: into the file fails the check).
TRACE_ROWS, CHECK_ROWS, CHECK_STEPS = 3, 64, 4
#: How far the file's outputs may stray from the agent's (float rounding of other kernels).
TOLERANCE = 1e-4


class GreedyPolicy(nn.Module):
    """A model's greedy policy as one traceable module: ``forward(obs (B, *obs)) -> (action,
    scores)``, or for a recurrent model ``forward(obs, state (B, S)) -> (action, scores,
    next_state)`` (see the module docstring for the names and dtypes).

    Args:
        model: the agent's model: ``model(obs) -> params`` or ``(params, value)``, or a
            recurrent ``model(obs, state) -> (params, value, state')``.
        kind: what ``scores`` holds: ``"logits"`` (a categorical head, or a head-less model
            returning ``(logits, value)``), ``"mean"`` (a Gaussian head), ``"q_values"``.
        head: the model's policy head (None: actions are the scores' argmax).

    Attributes:
        recurrent: ``forward`` takes and gives a state.
    """

    def __init__(self, model: nn.Module, kind: str, head: nn.Module | None = None) -> None:
        super().__init__()
        self.model, self.kind, self.head = model, kind, head
        self.recurrent = is_recurrent(model)

    def forward(self, obs: Tensor, state: Tensor | None = None) -> tuple[Tensor, ...]:
        if self.recurrent:
            params, _, next_state = self.model(obs, state)
        else:
            out = self.model(obs)
            params = out[0] if isinstance(out, tuple) else out
        if self.kind == "mean":
            mean = params[..., : self.head.n_dims]
            action, scores = self.head.to_env(mean), mean
        else:
            start = self.head.start if isinstance(self.head, CategoricalHead) else 0
            action = params.argmax(-1)
            action, scores = (action + start if start else action), params
        return (action, scores, next_state) if self.recurrent else (action, scores)


def greedy_module(policy: Policy) -> GreedyPolicy:
    """The :class:`GreedyPolicy` of a policy's agent (its ``model``), in eval mode on the CPU.

    Raises:
        CheckpointError: the policy cannot be exported (the message names its agent and model):
            an observation space that is not one array (Dict, Tuple), an agent without a torch
            ``model``, or a model whose head is neither categorical nor Gaussian.
    """
    agent = type(policy.agent).__name__
    leaves = observation_leaves(policy.observation_space)
    if len(leaves) != 1 or leaves[0].key != K.FRAME:
        raise CheckpointError(
            f"cannot export the policy of {agent}: its observation space "
            f"{policy.observation_space} is not one array (its parts: "
            f"{[leaf.key for leaf in leaves]}); export takes a Box or a Discrete observation "
            "space")
    model = getattr(policy.agent, "model", None)
    if not isinstance(model, nn.Module):
        raise CheckpointError(
            f"cannot export the policy of {agent}: the agent has no torch model (agent.model "
            f"is {type(model).__name__}); export wraps agent.model")
    # A copy without gradients on the CPU: the file's outputs need no torch.no_grad(), and the
    # policy's own model is left as it was.
    model = copy_module.deepcopy(model).cpu().eval().requires_grad_(False)
    name = f"{type(model).__module__}.{type(model).__qualname__}"
    head = getattr(model, "head", None)
    if isinstance(head, GaussianHead):
        kind = "mean"
    elif isinstance(head, CategoricalHead):
        kind = "logits"
    elif head is None and not is_recurrent(model):
        obs = _sample(policy.observation_space, TRACE_ROWS, 0)
        with torch.no_grad():
            out = model(torch.as_tensor(obs))
        kind = "logits" if isinstance(out, tuple) else "q_values"
    else:
        raise CheckpointError(
            f"cannot export the model {name} of {agent}: its head is {type(head).__name__}, "
            "neither a CategoricalHead nor a GaussianHead (rlstruct/blocks/distributions.py), "
            "so export does not know its greedy action")
    return GreedyPolicy(model, kind, head)


def signature(module: GreedyPolicy, policy: Policy) -> dict[str, Any]:
    """What the exported file takes and gives, as plain values: ``{"inputs": [{"name",
    "shape", "dtype"}...], "outputs": [...], "state_size", "observation_space",
    "action_space", "algo", "env_id", "frames", "model"}`` (shapes with ``"batch"`` first)."""
    examples = _examples(module, policy, TRACE_ROWS)
    with torch.no_grad():
        outs = module(*examples)
    names = _input_names(module), _output_names(module)

    def describe_tensors(names: list[str], tensors: tuple[Tensor, ...]) -> list[dict[str, Any]]:
        return [{"name": n, "shape": ["batch", *t.shape[1:]], "dtype": str(t.dtype).split(".")[-1]}
                for n, t in zip(names, tensors, strict=True)]

    cfg = policy.checkpoint.get("config") or {}
    model = module.model
    return {
        "inputs": describe_tensors(names[0], examples),
        "outputs": describe_tensors(names[1], outs),
        "state_size": int(getattr(model, "state_size", 0)),
        "observation_space": str(policy.observation_space),
        "action_space": str(policy.action_space),
        "algo": policy.checkpoint.get("algo"), "env_id": cfg.get("env_id"),
        "frames": policy.checkpoint.get("frames"),
        "model": f"{type(model).__module__}.{type(model).__qualname__}",
    }


def export_policy(run_dir: str | Path, format: str, out: str | Path | None = None,
                  checkpoint: str = "latest") -> Path:
    """Writes the greedy policy of a run's checkpoint to one file (see the module docstring).

    Args:
        run_dir: a run directory (``checkpoints/<checkpoint>.pt`` inside).
        format: ``"onnx"`` or ``"torchscript"``.
        out: the file to write (default: ``run_dir/policy.onnx`` or ``run_dir/policy.pt``).
        checkpoint: ``"latest"`` or ``"best"``.

    Returns:
        The path written.

    Raises:
        ConfigError: a bad ``format`` or ``checkpoint``, or ``onnx`` is not installed (the
            message says how to install the ``export`` extra); checked before anything loads.
        CheckpointError: ``run_dir`` is not a run or lacks the checkpoint (as
            :func:`rlstruct.load_policy` raises), its model cannot be exported (named), or the
            file written does not act as the agent does.
    """
    _check_format(format)
    policy = load_policy(run_dir, checkpoint)
    path = Path(out) if out is not None else Path(run_dir) / DEFAULT_NAMES[format]
    return write_policy(policy, format, path)


def write_policy(policy: Policy, format: str, out: str | Path) -> Path:
    """Writes ``policy``'s greedy policy to ``out`` as :func:`export_policy` does (for a
    :class:`~rlstruct.runs.policy.Policy` built in Python as well as a run's).

    Raises:
        ConfigError: a bad ``format``, or ``onnx`` is not installed.
        CheckpointError: the model cannot be exported, the exporter failed (its error named),
            or the file written does not act as the agent does.
    """
    _check_format(format)
    out = Path(out)
    module = greedy_module(policy)
    _check_against_agent(policy, module, lambda *xs: [t.numpy() for t in module(*xs)],
                         "the wrapped model")
    meta = signature(module, policy)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with torch.no_grad(), _quiet():
            run = (_write_onnx if format == "onnx" else _write_torchscript)(module, policy, meta,
                                                                           tmp)
        _check_against_agent(policy, module, run, f"the {format} file")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def read_signature(path: str | Path) -> dict[str, Any]:
    """The JSON signature (:func:`signature`) an exported file holds.

    Raises:
        CheckpointError: the file holds none (not written by :func:`export_policy`).
    """
    path = Path(path)
    try:
        if path.suffix == ".onnx":
            import onnx

            props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False)
                     .metadata_props}
            return json.loads(props[METADATA_KEY])
        extra = {"signature.json": ""}
        with _quiet():
            torch.jit.load(str(path), _extra_files=extra)
        return json.loads(extra["signature.json"])
    except Exception as err:  # a damaged file, no metadata: one typed error
        raise CheckpointError(f"{path} holds no rlstruct export signature "
                              f"({type(err).__name__}: {err})") from err


def describe(path: str | Path, meta: dict[str, Any]) -> str:
    """One line for the shell: ``PATH: obs (batch, 4) float32 -> action (batch,) int64, ...``."""
    def one(t: dict[str, Any]) -> str:
        return f"{t['name']} ({', '.join(map(str, t['shape']))}) {t['dtype']}".replace(
            "(batch)", "(batch,)")

    return (f"{path}: {', '.join(map(one, meta['inputs']))} -> "
            f"{', '.join(map(one, meta['outputs']))}")


# ----------------------------------------------------------------------------------- private
def _check_format(format: str) -> None:
    if format not in FORMATS:
        raise ConfigError(f"format must be one of {FORMATS}, got {format!r}")
    if format == "onnx":
        try:
            import onnx  # noqa: F401
        except ImportError as err:
            raise ConfigError(f"--format onnx needs the onnx package ({err}); install the "
                              f"export extra: {install_hint('export')}") from None


def _input_names(module: GreedyPolicy) -> list[str]:
    return ["obs", "state"] if module.recurrent else ["obs"]


def _output_names(module: GreedyPolicy) -> list[str]:
    return ["action", module.kind, *(["next_state"] if module.recurrent else [])]


def _sample(space: gym.Space, n: int, seed: int) -> np.ndarray:
    """``n`` observations drawn from ``space`` ``(n, *shape)``, in its dtype (from a copy of
    the space: the policy's keeps its own generator)."""
    space = copy_module.deepcopy(space)
    space.seed(seed)
    return np.stack([np.asarray(space.sample()) for _ in range(n)]).astype(space.dtype)


def _examples(module: GreedyPolicy, policy: Policy, n: int, seed: int = 0) -> tuple[Tensor, ...]:
    """The inputs of one call of ``module`` on ``n`` rows: observations, and a zero state."""
    obs = torch.as_tensor(_sample(policy.observation_space, n, seed))
    obs = obs.to(torch_dtype(policy.observation_space.dtype))
    if not module.recurrent:
        return (obs,)
    return obs, torch.zeros(n, module.model.state_size)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without the exporters' deprecation warnings (the formats asked for are these)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        yield


def _model_name(module: GreedyPolicy) -> str:
    return f"{type(module.model).__module__}.{type(module.model).__qualname__}"


def _write_onnx(module: GreedyPolicy, policy: Policy, meta: dict[str, Any], path: Path) -> Any:
    """Writes ``module`` as ONNX with its signature; returns a runner of the file
    (onnxruntime's; without it, torch's module: the file is then checked by onnx only)."""
    import onnx

    inputs, outputs = _input_names(module), _output_names(module)
    try:
        torch.onnx.export(module, _examples(module, policy, TRACE_ROWS), str(path), dynamo=False,
                          input_names=inputs, output_names=outputs, opset_version=OPSET,
                          dynamic_axes={name: {0: "batch"} for name in inputs + outputs})
        graph = onnx.load(str(path))
        graph.metadata_props.add(key=METADATA_KEY, value=json.dumps(meta))
        graph.doc_string = f"rlstruct export of {_model_name(module)}: {describe('', meta)[2:]}"
        onnx.checker.check_model(graph)
        onnx.save(graph, str(path))
    except Exception as err:  # the exporters raise many kinds: one typed error
        raise CheckpointError(f"cannot export the model {_model_name(module)} to ONNX: "
                              f"{type(err).__name__}: {str(err)[:500]}") from err
    try:
        import onnxruntime
    except ImportError:
        return lambda *xs: [t.numpy() for t in module(*xs)]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda *xs: session.run(None, {n: x.numpy() for n, x in zip(inputs, xs, strict=True)})


def _write_torchscript(module: GreedyPolicy, policy: Policy, meta: dict[str, Any],
                       path: Path) -> Any:
    """Writes ``module`` as a TorchScript trace with its signature; returns a runner of the
    file (``torch.jit.load``)."""
    try:
        traced = torch.jit.trace(module, _examples(module, policy, TRACE_ROWS), check_trace=False)
        torch.jit.save(traced, str(path), _extra_files={"signature.json": json.dumps(meta)})
        loaded = torch.jit.load(str(path))
    except Exception as err:  # tracing raises many kinds: one typed error
        raise CheckpointError(f"cannot export the model {_model_name(module)} to TorchScript: "
                              f"{type(err).__name__}: {str(err)[:500]}") from err
    return lambda *xs: [t.numpy() for t in loaded(*xs)]


def _check_against_agent(policy: Policy, module: GreedyPolicy, run: Any, what: str) -> None:
    """Checks that ``run`` (the module, or the file written) plays the agent's greedy actions,
    step by step with a carried state for a recurrent model, and gives the module's scores.

    Raises:
        CheckpointError: an action differs (other than between actions whose scores tie
            within :data:`TOLERANCE`), or the scores do.
    """
    session = policy.session()
    state = None
    for step in range(CHECK_STEPS if module.recurrent else 1):
        obs, *rest = _examples(module, policy, CHECK_ROWS, seed=1 + step)
        inputs = (obs, state if state is not None else rest[0]) if module.recurrent else (obs,)
        expected = np.asarray(session.act(obs.numpy()))
        with torch.no_grad():
            reference = [t.numpy() for t in module(*inputs)]
            got = [np.asarray(x) for x in run(*inputs)]
        problem = _difference(expected, got, reference, module)
        if problem:
            raise CheckpointError(
                f"cannot export the model {_model_name(module)} of {type(policy.agent).__name__}"
                f": {what} does not act as the agent does at step {step} ({problem})")
        if module.recurrent:
            state = torch.as_tensor(got[2])


def _difference(expected: np.ndarray, got: list[np.ndarray], reference: list[np.ndarray],
                module: GreedyPolicy) -> str:
    """What differs between the agent's actions ``expected`` and the outputs ``got``, given the
    module's own outputs ``reference``; empty when nothing does."""
    action, scores = got[0], got[1]
    if action.shape != expected.shape:
        return f"actions of shape {action.shape}, the agent's {expected.shape}"
    for name, a, b in zip(_output_names(module)[1:], got[1:], reference[1:], strict=True):
        if not np.allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE):
            return f"{name} differ by up to {np.abs(a - b).max():.3g}"
    if module.kind == "mean":
        if not np.allclose(action, expected, rtol=TOLERANCE, atol=TOLERANCE):
            return f"actions differ by up to {np.abs(action - expected).max():.3g}"
        return ""
    start = module.head.start if isinstance(module.head, CategoricalHead) else 0
    rows = np.flatnonzero(action != expected)
    index = np.arange(len(scores))
    gap = np.abs(scores[index, action - start] - scores[index, expected - start])[rows]
    if (gap > TOLERANCE).any():
        row = rows[np.argmax(gap)]
        return f"row {row}: action {action[row]}, the agent's {expected[row]}"
    return ""

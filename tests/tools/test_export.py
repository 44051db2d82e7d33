"""rlstruct/tools/export.py: ``rlstruct export RUN_DIR --format onnx|torchscript`` on tiny runs
of every algorithm, trained in this process (categorical, Gaussian and tanh-squashed heads,
DQN's Q values, the Nature CNN on uint8 frames, a GRU carrying its state): the file, run with
onnxruntime or ``torch.jit.load``, plays ``load_policy``'s greedy actions on 1,000 sampled
observations and gives the model's logits, means or Q values within 1e-5; the command line;
the typed errors."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from rlstruct import DictTensor
from rlstruct.agent import Agent
from rlstruct.blocks.distributions import CategoricalHead
from rlstruct.errors import CheckpointError, ConfigError
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.policy import Policy, load_policy
from rlstruct.tools.export import export_policy, read_signature, write_policy

#: name: (algorithm, env, frames, Config arguments, what the second output holds).
RUNS = {
    "ppo": ("ppo", "CartPole-v1", 256, {}, "logits"),
    "ppo-box": ("ppo", "Pendulum-v1", 256, {}, "mean"),
    "dqn": ("dqn", "CartPole-v1", 128, {"learning_starts": 64}, "q_values"),
    "sac": ("sac", "Pendulum-v1", 128, {"learning_starts": 64}, "mean"),
    "cnn": ("ppo", "Frames-v0", 32, {"model": "cnn", "env_module": ("support.toy_envs",),
                                     "n_timesteps": 16, "minibatch_size": 16, "n_epochs": 1},
            "logits"),
    "a2c-gru": ("a2c", "CartPole-v1", 256, {"model": "mlp-gru"}, "logits"),
    "reinforce": ("reinforce", "CartPole-v1", 256, {}, "logits"),
    "a2c": ("a2c", "CartPole-v1", 256, {}, "logits"),
    "impala": ("impala", "CartPole-v1", 256, {"layout": {"pipeline": 2}}, "logits"),
    "appo": ("appo", "CartPole-v1", 256, {"layout": {"pipeline": 2}}, "logits"),
    "trpo": ("trpo", "Pendulum-v1", 256, {}, "mean"),
}
#: Observations each check plays (the CNN's: fewer, 84x84 frames through three engines).
N_OBS, N_FRAMES = 1000, 256
TOL = 1e-5

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs[name]``: the run folder of ``RUNS[name]``, trained at its first use."""
    folder, cache = tmp_path_factory.mktemp("export_runs"), {}

    class Runs:
        def __getitem__(self, name: str) -> Path:
            if name not in cache:
                algo, env_id, frames, extra, _ = RUNS[name]
                extra = dict(extra)
                layout = LayoutConfig(n_processes=1, n_envs=2, **extra.pop("layout", {}))
                module = importlib.import_module(f"rlstruct.algos.{algo}")
                cfg = module.Config(env_id=env_id, max_frames=frames, eval_every=0,
                                    target_return=None, runs_dir=str(folder / name),
                                    layout=layout, **extra)
                cache[name] = Path(module.main(cfg)["run_dir"])
            return cache[name]

    return Runs()


def runner(path: Path, fmt: str):
    """The exported file as a function of numpy arrays (rlstruct plays no part in it)."""
    if fmt == "onnx":
        ort = pytest.importorskip("onnxruntime", reason="the export extra: pip install -e "
                                                        "'.[export]'")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return lambda *xs: session.run(None, dict(zip(names, xs, strict=True)))
    module = torch.jit.load(str(path))
    return lambda *xs: [t.numpy() for t in module(*(torch.as_tensor(x) for x in xs))]


def export(runs, name: str, fmt: str, tmp_path: Path) -> tuple[Policy, Path]:
    if fmt == "onnx":
        pytest.importorskip("onnx", reason="the export extra: pip install -e '.[export]'")
    path = export_policy(runs[name], fmt, tmp_path / f"{name}.{fmt}")
    return load_policy(runs[name]), path


def observations(space: gym.Space, n: int, seed: int = 0) -> np.ndarray:
    space.seed(seed)
    return np.stack([space.sample() for _ in range(n)]).astype(space.dtype)


def model_scores(policy: Policy, obs: np.ndarray, kind: str,
                 state: torch.Tensor | None = None) -> np.ndarray:
    """The logits, means or Q values of the policy's model itself, ``(n, P)``."""
    model = policy.agent.model
    with torch.no_grad():
        out = model(torch.as_tensor(obs)) if state is None else model(torch.as_tensor(obs), state)
    params = out[0] if isinstance(out, tuple) else out
    if kind == "mean":
        params = model.head.split(params)[0]
    return params.numpy()


def assert_same_actions(got: np.ndarray, expected: np.ndarray, scores: np.ndarray,
                        policy: Policy, kind: str) -> None:
    """Equal greedy actions: exactly, except between two discrete actions whose scores tie
    within TOL (the engines round differently); Box actions within TOL."""
    assert got.shape == expected.shape and got.dtype == expected.dtype
    if kind == "mean":
        np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL)
        assert policy.action_space.contains(got[0])
        return
    start = getattr(policy.agent.model, "head", None)
    start = start.start if isinstance(start, CategoricalHead) else 0
    np.testing.assert_array_equal(got, scores.argmax(-1) + start)  # the file's own argmax
    rows = np.arange(len(got))
    gap = np.abs(scores[rows, got - start] - scores[rows, expected - start])
    assert not ((got != expected) & (gap > TOL)).any()
    assert (got == expected).mean() > 0.99


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
@pytest.mark.parametrize("name", ["ppo", "ppo-box", "dqn", "sac", "cnn", "reinforce", "a2c",
                                  "impala", "appo", "trpo"])
def test_the_file_plays_the_policys_greedy_actions(runs, name, fmt, tmp_path):
    policy, path = export(runs, name, fmt, tmp_path)
    kind = RUNS[name][4]
    meta = read_signature(path)
    assert [t["name"] for t in meta["inputs"]] == ["obs"]
    assert [t["name"] for t in meta["outputs"]] == ["action", kind]
    obs = observations(policy.observation_space, N_FRAMES if name == "cnn" else N_OBS)
    assert meta["inputs"][0] == {"name": "obs", "shape": ["batch", *obs.shape[1:]],
                                 "dtype": str(obs.dtype)}  # uint8 frames stay uint8
    action, scores = runner(path, fmt)(obs)
    np.testing.assert_allclose(scores, model_scores(policy, obs, kind), rtol=TOL, atol=TOL)
    assert_same_actions(action, policy.act(obs), scores, policy, kind)
    assert runner(path, fmt)(obs[:1])[0].shape == action[:1].shape  # any batch size


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_recurrent_file_carries_its_state_as_policy_act_does(runs, fmt, tmp_path):
    policy, path = export(runs, "a2c-gru", fmt, tmp_path)
    meta = read_signature(path)
    assert [t["name"] for t in meta["inputs"]] == ["obs", "state"]
    assert [t["name"] for t in meta["outputs"]] == ["action", "logits", "next_state"]
    size = meta["state_size"]
    assert size == policy.agent.model.state_size > 0
    run, session = runner(path, fmt), policy.session()
    n_rows, n_steps = 50, N_OBS // 50
    state = np.zeros((n_rows, size), np.float32)  # an episode's start
    for step in range(n_steps):
        obs = observations(policy.observation_space, n_rows, seed=step)
        before = torch.zeros(n_rows, size) if session.memory is None else session.memory["h"]
        expected = session.act(obs)
        action, logits, state = run(obs, state)
        np.testing.assert_allclose(logits, model_scores(policy, obs, "logits", before),
                                   rtol=TOL, atol=TOL)
        np.testing.assert_allclose(state, session.memory["h"].numpy(), rtol=TOL, atol=TOL)
        assert_same_actions(action, expected, logits, policy, "logits")


@pytest.mark.gpu
def test_a_cuda_policy_exports_a_file_that_runs_on_the_cpu(runs, tmp_path):
    policy = load_policy(runs["ppo-box"], device="cuda:0")
    path = write_policy(policy, "torchscript", tmp_path / "policy.pt")
    assert all(p.device.type == "cuda" for p in policy.agent.model.parameters())  # untouched
    obs = observations(policy.observation_space, N_OBS)
    action, _ = runner(path, "torchscript")(obs)
    np.testing.assert_allclose(action, load_policy(runs["ppo-box"]).act(obs), rtol=1e-4,
                               atol=1e-5)


# ------------------------------------------------------------------------- the command line
def test_the_command_writes_into_the_run_folder_or_out(runs, tmp_path, capsys):
    from rlstruct.__main__ import main

    run_dir = runs["ppo"]
    capsys.readouterr()  # what training printed, if it trained here
    assert main(["export", str(run_dir), "--format", "torchscript"]) == 0
    line = capsys.readouterr().out.strip()
    assert line == (f"{run_dir / 'policy.pt'}: obs (batch, 4) float32 -> action (batch,) int64, "
                    "logits (batch, 2) float32")
    assert (run_dir / "policy.pt").is_file() and not list(run_dir.glob(".*.tmp"))
    out = tmp_path / "exports" / "best.pt"
    assert main(["export", str(run_dir), "--format", "torchscript", "--out", str(out),
                 "--checkpoint", "best"]) == 0
    best = torch.load(run_dir / "checkpoints" / "best.pt")
    assert read_signature(out)["frames"] == best["frames"]
    assert read_signature(out)["algo"] == "ppo" and read_signature(out)["env_id"] == "CartPole-v1"


def test_the_command_defaults_to_policy_onnx(runs, capsys):
    pytest.importorskip("onnx", reason="the export extra: pip install -e '.[export]'")
    from rlstruct.__main__ import main

    run_dir = runs["dqn"]
    capsys.readouterr()  # what training printed, if it trained here
    assert main(["export", str(run_dir), "--format", "onnx"]) == 0
    assert capsys.readouterr().out.startswith(f"{run_dir / 'policy.onnx'}: obs (batch, 4)")
    assert read_signature(run_dir / "policy.onnx")["outputs"][1]["name"] == "q_values"


def test_usage_and_run_errors_of_the_command(tmp_path, capsys):
    from rlstruct.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["export", str(tmp_path), "--format", "tflite"])
    assert info.value.code == 2 and "tflite" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["export", str(tmp_path)])  # --format is required
    assert info.value.code == 2
    capsys.readouterr()
    assert main(["export", str(tmp_path / "missing"), "--format", "torchscript"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rlstruct export: error: ") and "is not a run folder" in err
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------- errors
def test_a_bad_format_a_missing_run_and_a_missing_onnx_are_typed_errors(runs, tmp_path,
                                                                        monkeypatch):
    with pytest.raises(ConfigError, match=r"format must be one of \('onnx', 'torchscript'\), "
                                          r"got 'tflite'"):
        export_policy(runs["ppo"], "tflite")
    with pytest.raises(CheckpointError, match="is not a run folder"):
        export_policy(tmp_path / "missing", "torchscript")
    with pytest.raises(ConfigError, match="checkpoint must be 'latest' or 'best'"):
        export_policy(runs["ppo"], "torchscript", checkpoint="last")
    monkeypatch.setitem(sys.modules, "onnx", None)  # as without the extra
    with pytest.raises(ConfigError, match=r"--format onnx needs the onnx package .*export "
                                          r"extra: pip install -e '\.\[export\]'"):
        export_policy(runs["ppo"], "onnx", tmp_path / "p.onnx")
    assert list(tmp_path.iterdir()) == []


class _Net(nn.Module):
    """A model with a head export does not know."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        return self.head(frame)


class _Agent(Agent):
    """Plays ``model(frame)``'s argmin: not what its Q values' argmax says."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, state, observation, agent_info):
        with torch.no_grad():
            return DictTensor({"action": self.model(observation["frame"]).argmin(-1)}), state


def _policy(model: nn.Module, space: gym.Space | None = None) -> Policy:
    box = gym.spaces.Box(-1, 1, (4,), np.float32)
    return Policy(_Agent(model), space or box, gym.spaces.Discrete(2))


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_model_that_cannot_be_exported_is_named_and_leaves_no_file(fmt, tmp_path):
    if fmt == "onnx":
        pytest.importorskip("onnx", reason="the export extra: pip install -e '.[export]'")
    out = tmp_path / "policy"
    with pytest.raises(CheckpointError, match=r"cannot export the model \S*_Net of _Agent: "
                                              r"its head is Linear, neither"):
        write_policy(_policy(_Net()), fmt, out)
    with pytest.raises(CheckpointError, match=r"cannot export the model torch\.nn\.modules\.linear"
                                              r"\.Linear of _Agent: the wrapped model does not "
                                              r"act as the agent does .*action"):
        write_policy(_policy(nn.Linear(4, 2)), fmt, out)
    dict_space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (4,), np.float32)})
    with pytest.raises(CheckpointError, match=r"observation space Dict\('a': .* is not one "
                                              r"array \(its parts: \['a'\]\)"):
        write_policy(_policy(nn.Linear(4, 2), dict_space), fmt, out)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ the guide's examples
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-export.md"
#: The files the guide's examples name, and the (run, format) each stands for.
GUIDE_FILES = {"runs/ppo_CartPole-v1_20261125-101500/policy.onnx": ("ppo", "onnx"),
               "runs/ppo_CartPole-v1_20261125-101500/policy.pt": ("ppo", "torchscript"),
               "runs/a2c_CartPole-v1_20261125-101500/policy.onnx": ("a2c-gru", "onnx")}


def test_the_guides_examples_run_on_exported_files_without_rlstruct(runs, tmp_path, capsys):
    pytest.importorskip("onnxruntime", reason="the export extra: pip install -e '.[export]'")
    blocks = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), re.M | re.S)
    assert len(blocks) == 3
    files = {name: str(export(runs, run, fmt, tmp_path)[1])
             for name, (run, fmt) in GUIDE_FILES.items()}
    capsys.readouterr()  # what training printed, if it trained here
    for block in blocks:
        assert not re.search(r"^\s*(import|from) rlstruct", block, re.M), block
        for name, path in files.items():
            block = block.replace(name, path)
        assert "runs/" not in block
        exec(compile(block, str(GUIDE), "exec"), {})  # the page's own code
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "['obs'] ['action', 'logits']"
    assert [line.split()[0] for line in out[1:3]] == ["return", "return"]
    assert float(out[1].split()[1]) >= 1 and float(out[2].split()[1]) >= 1
    assert json.loads(out[3])["outputs"][0]["name"] == "action"

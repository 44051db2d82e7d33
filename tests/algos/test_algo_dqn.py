"""rlstruct/algos/dqn.py: known-answer tests of the loss pieces, smoke runs, a short learning
test."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from support.algo_runs import check_run_dir, evaluated_rows, run_algo
from support.trajectory_builders import steps

from rlstruct import DictTensor, replay_agent_stateless
from rlstruct.algos import dqn
from rlstruct.runs.layout import LayoutConfig


# ----------------------------------------------------------------------------- loss pieces
def _transitions():
    """Four transitions and two actions, the numbers worked out by hand below."""
    q = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [0.5, 0.0]], requires_grad=True)
    action = torch.tensor([1, 0, 1, 0])
    reward = torch.tensor([1.0, 1.0, 1.0, 0.2])
    terminated = torch.tensor([False, True, False, False])
    truncated = torch.tensor([False, False, True, False])
    next_online = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    next_target = torch.tensor([[10.0, 20.0], [30.0, 40.0], [50.0, 60.0], [0.0, 0.0]])
    return q, action, reward, terminated, truncated, next_online, next_target


@pytest.mark.parametrize(
    ("double", "targets"),
    [
        # a* from the online net: (1, 0, 0, 0) -> Q_target(s', a*) = (20, 30, 50, 0).
        (True, [1 + 0.5 * 20, 1.0, 1 + 0.5 * 50, 0.2]),
        # a* from the target net: (1, 1, 1, 0) -> (20, 40, 60, 0).
        (False, [1 + 0.5 * 20, 1.0, 1 + 0.5 * 60, 0.2]),
    ],
)
def test_dqn_loss_known_answer(double, targets):
    # Row 1 terminated: no bootstrap. Row 2 truncated: bootstraps from Q of the true final obs.
    q, action, reward, terminated, truncated, next_online, next_target = _transitions()
    loss, stats = dqn.dqn_loss(
        q, action, reward, terminated, truncated, next_online, next_target,
        gamma=0.5, double=double,
    )
    q_taken = [2.0, 3.0, 6.0, 0.5]
    diffs = [y - v for y, v in zip(targets, q_taken)]
    huber = [0.5 * d * d if abs(d) < 1 else abs(d) - 0.5 for d in diffs]
    assert loss.item() == pytest.approx(sum(huber) / 4)
    assert stats["q"] == pytest.approx(sum(q_taken) / 4)
    assert stats["td_error"] == pytest.approx(sum(abs(d) for d in diffs) / 4)
    # The gradient reaches only Q(s, a) of the taken action, clipped to +-1 by the Huber loss.
    loss.backward()
    expected = torch.zeros(4, 2)
    for i, (a, d) in enumerate(zip(action.tolist(), diffs)):
        expected[i, a] = -max(-1.0, min(1.0, d)) / 4
    torch.testing.assert_close(q.grad, expected)


def test_replay_of_buffer_samples_gives_q_of_s_and_s_next():
    model = dqn.QNetwork(obs_dim=3, n_actions=2, hidden=8, dueling=False)
    buffer = dqn.ReplayBuffer(16, keys=dqn.STORED_KEYS)
    frame, next_frame = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    flags = torch.zeros(2, 4, dtype=torch.bool)
    buffer.add(
        steps(
            [4, 2], frame=frame, next_frame=next_frame, action=torch.zeros(2, 4, dtype=torch.long),
            reward=torch.ones(2, 4), terminated=flags, truncated=flags,
        )
    )
    sample = buffer.sample(5)  # transitions: replayed directly, one batched call
    out = replay_agent_stateless(dqn.QAgent(model), sample)
    assert isinstance(out, DictTensor) and out.n_elems() == 5
    torch.testing.assert_close(out["q"], model(sample["observation/frame"]))
    torch.testing.assert_close(out["next_q"], model(sample["_observation/frame"]))


def test_dueling_head_is_value_plus_centred_advantage():
    model = dqn.QNetwork(obs_dim=3, n_actions=4, hidden=8, dueling=True)
    frame = torch.randn(5, 3)
    q = model(frame)
    value = model.value(model.body(frame)).squeeze(-1)
    torch.testing.assert_close(q.mean(-1), value)


def test_update_target_hard_and_soft():
    online, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    before = target.weight.detach().clone()
    dqn.update_target(target, online, tau=0.25)
    torch.testing.assert_close(target.weight, before + 0.25 * (online.weight - before))
    dqn.update_target(target, online, tau=1.0)
    torch.testing.assert_close(target.weight, online.weight)


def test_epsilon_schedule_and_per_row_spread():
    cfg = dqn.Config(eps_start=1.0, eps_end=0.1, eps_frames=1000)
    assert dqn.epsilon(0, 4, cfg)["epsilon"].tolist() == pytest.approx([1.0] * 4)
    assert dqn.epsilon(500, 4, cfg)["epsilon"].tolist() == pytest.approx([0.55] * 4)
    assert dqn.epsilon(5000, 4, cfg)["epsilon"].tolist() == pytest.approx([0.1] * 4)
    spread = dqn.epsilon(5000, 3, dqn.Config(eps_end=0.1, eps_frames=1000, eps_spread=2.0))
    assert spread["epsilon"].tolist() == pytest.approx([0.1, 0.1**2, 0.1**3])


def test_agent_explores_per_row_and_is_reproducible():
    model = dqn.QNetwork(obs_dim=3, n_actions=4, hidden=8, dueling=False)
    n = 2000
    obs = DictTensor({"frame": torch.randn(n, 3)})
    greedy = model(obs["frame"]).argmax(-1)
    eps = DictTensor({"epsilon": torch.cat([torch.zeros(n // 2), torch.ones(n // 2)])})
    a, b = dqn.QAgent(model), dqn.QAgent(model)
    a.seed(3)
    b.seed(3)
    action = a(DictTensor(batch_size=n), obs, eps)[0]["action"]
    assert action.equal(b(DictTensor(batch_size=n), obs, eps)[0]["action"])
    assert action[: n // 2].equal(greedy[: n // 2])  # epsilon 0: greedy
    agree = (action[n // 2 :] == greedy[n // 2 :]).float().mean().item()
    assert agree == pytest.approx(0.25, abs=0.05)  # epsilon 1: uniform over 4 actions
    assert a(DictTensor(batch_size=n), obs, DictTensor())[0]["action"].equal(greedy)


def test_learn_takes_one_gradient_step_and_leaves_the_target_alone():
    torch.manual_seed(0)
    model = dqn.QNetwork(obs_dim=3, n_actions=2, hidden=8, dueling=False)
    target = dqn.QNetwork(obs_dim=3, n_actions=2, hidden=8, dueling=False)
    sample = DictTensor({
        "observation/frame": torch.randn(6, 3), "_observation/frame": torch.randn(6, 3),
        "action/action": torch.randint(2, (6,)), "_observation/reward": torch.ones(6),
        "_observation/terminated": torch.zeros(6, dtype=torch.bool),
        "_observation/truncated": torch.zeros(6, dtype=torch.bool),
    })
    before = [p.detach().clone() for p in model.parameters()]
    target_before = [p.detach().clone() for p in target.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = dqn.learn(dqn.QAgent(model), target, optimizer, sample, dqn.Config(max_grad_norm=0))
    assert set(stats) == {"loss", "q", "td_error"} and stats["loss"] > 0
    assert any(not p.equal(q) for p, q in zip(model.parameters(), before))
    assert all(p.equal(q) for p, q in zip(target.parameters(), target_before))


# ----------------------------------------------------------------------------- runs
SMOKE = [
    "--max-frames", "3000", "--n-envs", "2", "--learning-starts", "500",
    "--updates-per-batch", "4", "--eval-every", "2", "--seed", "0",
]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_smoke_run_from_another_folder_writes_a_complete_run_dir(tmp_path):
    # Worker processes, dueling head, plain (not double) targets, soft target updates.
    run_dir, stdout = run_algo(
        "dqn", [*SMOKE, "--dueling", "--no-double", "--tau", "0.5", "--target-update-every", "2"],
        cwd=tmp_path,
    )
    rows = check_run_dir(run_dir)
    assert int(rows[-1]["frames"]) >= 3000 and int(rows[-2]["updates"]) > 0
    assert evaluated_rows(rows) and "dqn: stopped by max_frames" in stdout
    checkpoint = torch.load(run_dir / "checkpoints" / "latest.pt")
    assert {"model", "target", "optimizer"} <= set(checkpoint)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_check_devices_smoke_run(tmp_path):
    run_dir, _ = run_algo("dqn", [*SMOKE, "--check-devices"], cwd=tmp_path)
    check_run_dir(run_dir)


def test_a_resumed_run_continues_with_its_replay_buffer(tmp_path):
    def run(frames: int, **kw) -> Path:
        cfg = dqn.Config(layout=LayoutConfig(learner_device="cpu", n_processes=1, n_envs=2),
                         n_timesteps=8, hidden=16, learning_starts=16, updates_per_batch=2,
                         eval_every=0, target_return=None, max_frames=frames,
                         runs_dir=str(tmp_path), **kw)
        return Path(dqn.main(cfg)["run_dir"])

    def buffer_rows(run_dir: Path) -> int:
        return int(torch.load(run_dir / "checkpoints" / "buffer.pt")["state"]["size"])

    run_dir = run(48)  # segments of 16 frames; the one that ends the run is not stored
    assert buffer_rows(run_dir) == 32
    run(80, resume=str(run_dir))
    assert buffer_rows(run_dir) == 48  # 32 saved, 16 new
    assert not (run(32, checkpoint_buffer=False) / "checkpoints" / "buffer.pt").exists()


@pytest.mark.slow
def test_learns_the_repeat_env(tmp_path):
    # Reward 1 per step for repeating the observed symbol: random play earns 5 of 10.
    cfg = dqn.Config(
        env_id="rlstruct/Repeat-v0", layout=LayoutConfig(learner_device="cpu", n_processes=1),
        n_timesteps=16, hidden=32, learning_starts=500, eps_frames=2000, updates_per_batch=16,
        target_update_every=32, eval_every=0, target_return=9.0, max_frames=40_000,
        time_budget=50, runs_dir=str(tmp_path),
    )
    summary = dqn.main(cfg)
    assert summary["train_return_mean20"] >= 8.0, summary


@pytest.mark.gpu
def test_gpu_layout(tmp_path):
    cfg = dqn.Config(
        layout=LayoutConfig(learner_device="cuda:0", batcher_device="cuda", eval_device="cpu",
                            n_envs=4, check_devices=True),
        max_frames=2000, learning_starts=500, updates_per_batch=4, eval_every=2,
        runs_dir=str(tmp_path),
    )
    summary = dqn.main(cfg)
    assert not math.isnan(summary["eval_return"])
    check_run_dir(Path(summary["run_dir"]))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_atari_preset_learns_on_the_cnn_from_a_frame_buffer_that_resumes(tmp_path):
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install -e '.[atari]'")
    pytest.importorskip("cv2", reason="needs the atari extra: pip install -e '.[atari]'")
    from rlstruct.runs.presets import build_preset  # the preset as --preset atari applies it

    def run(frames: int, **kw) -> dict:
        cfg = build_preset(dqn.Config, "atari", dict(
            n_processes=1, n_envs=2, n_timesteps=16, buffer_size=400, learning_starts=64,
            updates_per_batch=2, max_frames=frames, runs_dir=str(tmp_path), **kw))
        return dqn.main(cfg)

    summary = run(160)
    run_dir = Path(summary["run_dir"])
    latest = torch.load(run_dir / "checkpoints" / "latest.pt")
    assert "body.0.weight" in latest["model"] and latest["config"]["model"] == "cnn"
    saved = torch.load(run_dir / "checkpoints" / "buffer.pt")["state"]
    assert saved["frame_shape"] == [84, 84] and saved["ids"].shape[2] == 4  # frames, once each
    assert 128 <= saved["size"] < saved["n_frames"] < 2 * saved["size"]
    resumed = run(224, resume=str(run_dir))
    assert resumed["frames"] >= 224
    size = torch.load(run_dir / "checkpoints" / "buffer.pt")["state"]["size"]
    assert size == saved["size"] + 32  # the saved transitions, then the one segment stored


def test_the_cnn_is_refused_for_flat_observations_before_a_run_folder_exists(tmp_path):
    from rlstruct.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--model cnn takes stacked frames .* \(4,\)"):
        dqn.main(dqn.Config(model="cnn", runs_dir=str(tmp_path)))
    assert not any(tmp_path.iterdir())

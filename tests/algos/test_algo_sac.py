"""rlstruct/algos/sac.py: known-answer tests of the soft target and the losses, the twin critics,
the
Polyak update, the agent, the config checks, and a bounded learning run on Pendulum (slow)."""

from __future__ import annotations

import copy
import math
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from support.algo_runs import check_run_dir, run_algo

from rlstruct import DictTensor
from rlstruct.algos import sac
from rlstruct.batchers import SerialBatcher
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.replay_buffer import ReplayBuffer
from rlstruct.envs import GymEnvInf
from rlstruct.errors import ConfigError
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.loop import RunLoop
from rlstruct.runs.resolve import resolve


# ----------------------------------------------------------------------------- soft target
def test_soft_target_uses_min_of_twin_targets_and_the_entropy_term():
    # Row 0: min(5, 3) = 3 from critic 2. Row 1: min(1, 4) = 1 from critic 1, but terminated.
    # Row 2: min(2, 7) = 2, truncated: bootstraps from the true final observation as usual.
    reward = torch.tensor([1.0, 2.0, -1.0])
    terminated = torch.tensor([False, True, False])
    truncated = torch.tensor([False, False, True])
    next_q = torch.tensor([[5.0, 1.0, 2.0], [3.0, 4.0, 7.0]])
    next_logp = torch.tensor([-1.0, 0.5, 2.0])
    y = sac.soft_target(reward, terminated, truncated, next_q, next_logp, alpha=0.5, gamma=0.9)
    expected = [1 + 0.9 * (3 - 0.5 * -1.0), 2.0, -1 + 0.9 * (2 - 0.5 * 2.0)]
    torch.testing.assert_close(y, torch.tensor(expected))


def test_sac_losses_known_answer_and_which_parameters_each_moves():
    q = torch.tensor([[1.0, 2.0], [3.0, 0.0]], requires_grad=True)
    target = torch.tensor([2.0, 2.0])
    q_pi = torch.tensor([[4.0, -1.0], [2.0, 3.0]], requires_grad=True)
    logp = torch.tensor([-1.0, 0.0], requires_grad=True)
    log_alpha = torch.tensor(math.log(0.5), requires_grad=True)
    loss, stats = sac.sac_losses(q, target, q_pi, logp, log_alpha, target_entropy=-1.0)
    critic = 0.5 * ((1 + 0) / 2 + (1 + 4) / 2)  # 1/2 sum_i mean (Q_i - y)^2
    actor = ((0.5 * -1 - 2) + (0.5 * 0 - -1)) / 2  # alpha logp - min_i Q_i(s, a~)
    temperature = -math.log(0.5) * ((-1 - 1) + (0 - 1)) / 2
    assert loss.item() == pytest.approx(critic + actor + temperature)
    assert stats["critic_loss"].item() == pytest.approx(critic)
    assert stats["actor_loss"].item() == pytest.approx(actor)
    assert stats["alpha"].item() == pytest.approx(0.5)
    loss.backward()
    # alpha enters the actor's loss detached: logp's gradient is alpha / N only.
    torch.testing.assert_close(logp.grad, torch.tensor([0.25, 0.25]))
    # The actor's loss reaches the smaller critic of each row only.
    torch.testing.assert_close(q_pi.grad, torch.tensor([[0.0, -0.5], [-0.5, 0.0]]))
    # d L_alpha / d log_alpha = -mean(logp + H_target) = 1.5
    assert log_alpha.grad.item() == pytest.approx(1.5)


# ----------------------------------------------------------------------------- networks
def test_twin_q_is_two_independent_mlps():
    torch.manual_seed(0)
    critic = sac.TwinQ(obs_dim=3, act_dim=2, hidden=8)
    frame, action = torch.randn(5, 3), torch.randn(5, 2)
    q = critic(frame, action)
    assert q.shape == (2, 5)
    x = torch.cat([frame, action], -1)
    for i in range(2):  # one critic at a time, the plain way
        h = x
        for k, (w, b) in enumerate(zip(critic.weights, critic.biases)):
            h = h @ w[i] + b[i, 0]
            h = torch.relu(h) if k < len(critic.weights) - 1 else h
        torch.testing.assert_close(q[i], h.squeeze(-1))
    assert not torch.equal(q[0], q[1])  # independently initialised


def test_frozen_critic_passes_gradients_to_the_action_only():
    critic = sac.TwinQ(obs_dim=3, act_dim=1, hidden=8)
    action = torch.randn(4, 1, requires_grad=True)
    critic(torch.randn(4, 3), action, frozen=True).sum().backward()
    assert action.grad is not None and action.grad.abs().sum() > 0
    assert all(p.grad is None for p in critic.parameters())


def test_polyak_update():
    target = [torch.tensor([0.0, 10.0]), torch.tensor([[4.0]])]
    online = [torch.tensor([1.0, 0.0]), torch.tensor([[2.0]])]
    sac.polyak(target, online, tau=0.25)
    torch.testing.assert_close(target[0], torch.tensor([0.25, 7.5]))
    torch.testing.assert_close(target[1], torch.tensor([[3.5]]))
    assert torch.equal(online[0], torch.tensor([1.0, 0.0]))  # the online weights are unchanged


def test_agent_stays_in_the_box_is_seeded_and_greedy_is_deterministic():
    space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
    actor = sac.Actor(obs_dim=3, action_space=space_spec(space), hidden=8)
    with torch.no_grad():
        actor.head.mean.bias.copy_(torch.tensor([30.0, -30.0]))  # saturated tanh
    agent = sac.SACAgent(actor)
    obs = DictTensor({"frame": torch.randn(64, 3)})
    low, high = torch.tensor(space.low), torch.tensor(space.high)

    def act(info):
        out = agent(DictTensor(), obs, info)[0]
        return out["action"], out["squashed"]

    agent.seed(3)
    action, squashed = act(DictTensor())
    assert action.dtype == torch.float32 and ((action >= low) & (action <= high)).all()
    # The critics read tanh(u) in (-1, 1); the env gets it rescaled to the Box.
    torch.testing.assert_close(action, (low + (squashed + 1) * (high - low) / 2).clamp(low, high))
    agent.seed(3)
    assert torch.equal(act(DictTensor())[0], action)
    greedy = DictTensor({"greedy": torch.ones(64, dtype=torch.bool)})
    assert torch.equal(act(greedy)[0], act(greedy)[0])
    mean = actor.head.greedy(actor(obs["frame"]))
    torch.testing.assert_close(act(greedy)[1], mean.tanh())


def test_config_lists_every_problem():
    with pytest.raises(ConfigError, match=r"(?s)batch_size must be > 0.*utd must be > 0.*tau"):
        resolve(sac.Config(batch_size=0, utd=0.0, tau=1.5))


def test_learn_on_replayed_pendulum_segments_moves_every_part():
    # The buffer is fed the way main() feeds it: segments of a SerialBatcher over GymEnvInf.
    torch.manual_seed(0)
    cfg = sac.Config(batch_size=32)
    space = gym.make("Pendulum-v1").action_space
    actor = sac.Actor(3, space_spec(space), hidden=16)
    with SerialBatcher(16, sac.SACAgent, {"model": actor}, GymEnvInf,
                       {"env": "Pendulum-v1", "n_envs": 2}, seeds=0) as batcher:
        batcher.reset()
        batcher.execute()
        traj, _ = batcher.get()
    buffer = ReplayBuffer(100, keys=sac.STORED_KEYS)
    assert buffer.add(traj) == 32
    squashed = buffer.transitions()[sac.STORED_SQUASHED]
    assert squashed.abs().max() < 1  # tanh(u): what the critics read
    nets = sac.sac_nets(None, partial(sac.TwinQ, 3, 1, 16), init_alpha=1.0, actor=actor)
    critic, target, log_alpha = nets.critic, nets.target, nets.temperature["log_alpha"]
    optimizer = torch.optim.Adam([*actor.parameters(), *critic.parameters(), log_alpha], lr=0.01)
    before = [copy.deepcopy(m.state_dict()) for m in (actor, critic, target)]
    old_target = [p.clone() for p in target.parameters()]
    stats = sac.learn(nets, optimizer, buffer.sample(32), cfg)  # H_target = -dim(A) = -1
    assert all(math.isfinite(float(v)) for v in stats.values())
    for module, old in zip((actor, critic, target), before):
        assert any(not torch.equal(v, old[k]) for k, v in module.state_dict().items())
    assert log_alpha.item() != 0.0
    # The target moved by exactly tau towards the critic's new weights.
    for t, o, c in zip(target.parameters(), old_target, critic.parameters()):
        torch.testing.assert_close(t, o + cfg.tau * (c.detach() - o))


# ----------------------------------------------------------------------------- runs
@pytest.mark.slow
def test_learns_pendulum(tmp_path: Path):
    # Bounded: 90 s of training at most. The run stops once the mean of its last 20 episodes
    # passes -500, far above a random policy's ~-1200 (about 5k frames, 20-30 s on 2 busy cores).
    run_dir, out = run_algo(
        "sac", ["--time-budget", "90", "--max-frames", "20000", "--eval-every", "0",
                "--target-return", "-500"],
        tmp_path, timeout=180,
    )
    rows = check_run_dir(run_dir)
    assert float(rows[-1]["train_return_mean20"]) > -500, out
    assert "solved after" in out, out


def test_the_weights_are_published_after_the_step_so_a_pipelined_worker_lags_one_update(
        tmp_path: Path, monkeypatch):
    """The preset's layout (one worker, --pipeline 2) plays frame t with the weights after step
    t - 2: each iteration stores its segment, takes its steps, THEN publishes (publishing before
    the steps made it t - 3: two updates of lag where the issue allows one)."""
    events: list[str] = []
    add, learn, publish = ReplayBuffer.add, sac.learn, RunLoop.publish
    monkeypatch.setattr(ReplayBuffer, "add", lambda self, *a, **k: (events.append("S"),
                                                                    add(self, *a, **k))[1])
    monkeypatch.setattr(sac, "learn", lambda *a, **k: (events.append("L"), learn(*a, **k))[1])
    monkeypatch.setattr(RunLoop, "publish", lambda self, *a, **k: (events.append("P"),
                                                                   publish(self, *a, **k))[1])
    summary = sac.main(sac.Config(
        max_frames=40, learning_starts=16, batch_size=8, hidden=16, eval_every=0,
        target_return=None, runs_dir=str(tmp_path), n_timesteps=1,
        layout=LayoutConfig(n_processes=1, n_envs=1, pipeline=2)))
    assert summary["frames"] >= 40
    iterations = "".join(events).split("S")[1:]  # one per stored segment: its steps, a publish
    assert len(iterations) >= 39 and iterations[-1] == "LP", events
    assert all(it in ("P", "LP") for it in iterations), iterations
    assert iterations.count("LP") >= 20, iterations


def buffer_rows(run_dir: Path) -> int:
    """The rows of the replay buffer a run saved with its last checkpoint."""
    saved = torch.load(run_dir / "checkpoints" / "buffer.pt")
    latest = torch.load(run_dir / "checkpoints" / "latest.pt")
    assert saved["iteration"] == latest["iteration"]
    return int(saved["state"]["size"])


def test_a_resumed_run_continues_with_its_replay_buffer(tmp_path: Path, capfd):
    def config(frames: int, **kw) -> sac.Config:
        return sac.Config(max_frames=frames, learning_starts=32, batch_size=16, hidden=16,
                          eval_every=0, target_return=None, runs_dir=str(tmp_path), **kw)

    # Segments of 4 envs x 8 steps; the one that reaches max_frames ends the run unstored.
    run_dir = Path(sac.main(config(96))["run_dir"])
    assert buffer_rows(run_dir) == 64
    sac.main(config(160, resume=str(run_dir)))
    assert buffer_rows(run_dir) == 96  # the 64 saved rows and 32 new ones
    # A checkpoint without the buffer (an older rlstruct): it resumes, says so, starts empty.
    (run_dir / "checkpoints" / "buffer.pt").unlink()
    sac.main(config(224, resume=str(run_dir)))
    err = capfd.readouterr().err
    assert "buffer.pt is absent, not 3 (latest.pt's): buffer starts as built" in err
    assert buffer_rows(run_dir) == 32
    # Off: no buffer file, and the buffer's state is not in latest.pt either.
    off = Path(sac.main(config(64, checkpoint_buffer=False))["run_dir"])
    assert not (off / "checkpoints" / "buffer.pt").exists()
    assert "buffer" not in torch.load(off / "checkpoints" / "latest.pt")


@pytest.mark.gpu
def test_gpu_layout(tmp_path: Path):
    cfg = sac.Config(
        layout=LayoutConfig(learner_device="cuda:0", batcher_device="cuda", eval_device="cpu",
                            n_processes=1, n_envs=4, check_devices=True),
        max_frames=1500, learning_starts=500, eval_every=5, runs_dir=str(tmp_path),
    )
    summary = sac.main(cfg)
    assert summary["frames"] >= 1500 and not math.isnan(summary["eval_return"])
    check_run_dir(Path(summary["run_dir"]))

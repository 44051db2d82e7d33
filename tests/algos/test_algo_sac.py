"""rlstruct/algos/sac.py: known-answer tests of the soft target and the losses, the twin critics,
the Polyak update, the whole step against SAC written out plainly, the agent, the config checks,
the concurrent losses (the same step as the summed loss), and a bounded learning run on
Pendulum (slow)."""

from __future__ import annotations

import copy
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from support.algo_runs import check_run_dir, run_algo

from rlstruct import DictTensor
from rlstruct import keys as K
from rlstruct.algos import sac
from rlstruct.batchers import SerialBatcher
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.replay_buffer import ReplayBuffer
from rlstruct.envs import GymEnvInf
from rlstruct.errors import ConfigError
from rlstruct.runs.evaluator import Evaluator
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


def test_the_losses_known_answer_and_which_inputs_each_moves():
    q = torch.tensor([[1.0, 2.0], [3.0, 0.0]], requires_grad=True)
    target = torch.tensor([2.0, 2.0])
    q_pi = torch.tensor([[4.0, -1.0], [2.0, 3.0]], requires_grad=True)
    logp = torch.tensor([-1.0, 0.0], requires_grad=True)
    log_alpha = torch.tensor(math.log(0.5), requires_grad=True)
    critic = sac.critic_loss(q, target)
    policy, stats = sac.policy_losses(q_pi, logp, log_alpha, target_entropy=-1.0)
    actor = ((0.5 * -1 - 2) + (0.5 * 0 - -1)) / 2  # alpha logp - min_i Q_i(s, a~)
    temperature = -math.log(0.5) * ((-1 - 1) + (0 - 1)) / 2
    assert critic.item() == pytest.approx(0.5 * ((1 + 0) / 2 + (1 + 4) / 2))  # 1/2 sum_i mean
    assert policy.item() == pytest.approx(actor + temperature)
    assert stats["actor_loss"].item() == pytest.approx(actor)
    assert stats["alpha"].item() == pytest.approx(0.5)
    assert stats["entropy"].item() == pytest.approx(0.5)
    critic.backward()
    torch.testing.assert_close(q.grad, torch.tensor([[-0.5, 0.0], [0.5, -1.0]]))
    policy.backward()
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


def _plain_sac_step(nets, optimizer, sample, gamma: float, tau: float) -> None:
    """SAC's step written out plainly, as before the speed work: one actor pass over ``s`` and
    ``s'`` together, each critic on its own, one backward through the three losses' sum."""
    actor, log_alpha, n = nets.actor, nets.temperature["log_alpha"], sample.n_elems()
    params = actor(torch.cat([sample[K.OBS_FRAME], sample[K.NEXT_FRAME]]))
    mean, log_std = actor.head.split(params)
    u = mean + log_std.exp() * torch.randn(2 * n, actor.head.n_dims)  # s, then s'
    logp, a = actor.head.log_prob(params, u), actor.head.squash(u)

    def q(module, s, act, i):  # critic i: two ReLU layers and a linear output, (N,)
        x = torch.cat([s, act], 1)
        for j, (w, b) in enumerate(zip(module.weights, module.biases)):
            x = (x if j == 0 else torch.relu(x)) @ w[i] + b[i]
        return x[:, 0]
    s, s2, alpha = sample[K.OBS_FRAME], sample[K.NEXT_FRAME], log_alpha.exp().detach()
    with torch.no_grad():
        soft_v = torch.min(q(nets.target, s2, a[n:], 0), q(nets.target, s2, a[n:], 1))
        y = sample[K.NEXT_REWARD] + gamma * (1 - sample[K.NEXT_TERMINATED].float()) * (
            soft_v - alpha * logp[n:])
    loss_q = sum(0.5 * (q(nets.critic, s, sample[sac.STORED_SQUASHED], i) - y).pow(2).mean()
                 for i in range(2))
    frozen = copy.deepcopy(nets.critic).requires_grad_(False)  # the actor's gradient only
    q_pi = torch.min(q(frozen, s, a[:n], 0), q(frozen, s, a[:n], 1))
    loss_pi = (alpha * logp[:n] - q_pi).mean()
    loss_alpha = -(log_alpha * (logp[:n].detach() - actor.head.n_dims)).mean()
    optimizer.zero_grad()
    (loss_q + loss_pi + loss_alpha).backward()
    optimizer.step()
    with torch.no_grad():
        for t, o in zip(nets.target.parameters(), nets.critic.parameters()):
            t.mul_(1 - tau).add_(tau * o)


def test_learn_takes_the_step_of_sac_written_out_plainly():
    """The speed work (twin critics batched, no graph at s', the losses split for
    --concurrent-losses) kept SAC's step: six steps of ``learn`` and of the plain formulation
    from the same weights and noise end at the same weights, to float rounding."""
    g = torch.Generator().manual_seed(3)
    samples = [DictTensor({
        K.OBS_FRAME: torch.randn(64, 3, generator=g), K.NEXT_FRAME: torch.randn(64, 3, generator=g),
        sac.STORED_SQUASHED: torch.rand(64, 2, generator=g) * 2 - 1,
        K.NEXT_REWARD: torch.randn(64, generator=g), K.NEXT_TERMINATED: torch.rand(64, generator=g)
        < 0.2, K.NEXT_TRUNCATED: torch.rand(64, generator=g) < 0.1}) for _ in range(6)]
    cfg = sac.Config(batch_size=64, gamma=0.9, tau=0.1, max_grad_norm=0.0)

    def nets_and_adam():
        torch.manual_seed(0)
        nets = sac.sac_nets(partial(sac.Actor, 3, space_spec(gym.spaces.Box(-1, 1, (2,))), 16),
                            partial(sac.TwinQ, 3, 2, 16), init_alpha=0.5)
        return nets, torch.optim.Adam(nets.parameters(), lr=0.01)
    fast, plain = nets_and_adam(), nets_and_adam()
    start = copy.deepcopy(fast[0].state_dict())
    for i, sample in enumerate(samples):
        torch.manual_seed(100 + i)
        sac.learn(*fast, sample, cfg)
        torch.manual_seed(100 + i)
        _plain_sac_step(*plain, sample, cfg.gamma, cfg.tau)
    moved = 0
    for (name, a), (_, b) in zip(fast[0].state_dict().items(), plain[0].state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
        moved += not torch.equal(a, start[name])
    assert moved == len(fast[0].state_dict())  # every tensor moved, the target and alpha too


def test_concurrent_losses_take_the_summed_losses_step_with_the_policy_loss_in_the_pool():
    """The critic's loss in the caller's thread, the policy's in the pool's: the weights after
    a few steps are bit-equal to those of one backward through the sum (one torch thread)."""
    sample = DictTensor({
        K.OBS_FRAME: torch.randn(64, 3), sac.STORED_SQUASHED: torch.rand(64, 1) * 2 - 1,
        K.NEXT_FRAME: torch.randn(64, 3), K.NEXT_REWARD: torch.randn(64),
        K.NEXT_TERMINATED: torch.rand(64) < 0.1, K.NEXT_TRUNCATED: torch.zeros(64, dtype=bool)})
    cfg, threads, policy_losses = sac.Config(batch_size=64), [], sac.policy_losses

    def nets_and_adam():
        torch.manual_seed(0)
        nets = sac.sac_nets(partial(sac.Actor, 3, space_spec(gym.spaces.Box(-1, 1, (1,))), 16),
                            partial(sac.TwinQ, 3, 1, 16), init_alpha=1.0)
        return nets, torch.optim.Adam(nets.parameters(), lr=0.01)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(1, "policy-pool") as pool, pytest.MonkeyPatch.context() as mp:
            mp.setattr(sac, "policy_losses", lambda *a, **k: (
                threads.append(threading.current_thread().name), policy_losses(*a, **k))[1])
            summed, concurrent = nets_and_adam(), nets_and_adam()
            for i in range(4):
                torch.manual_seed(i)
                stats = sac.learn(*summed, sample, cfg)
                torch.manual_seed(i)
                assert sac.learn(*concurrent, sample, cfg, pool=pool).keys() == stats.keys()
    finally:
        torch.set_num_threads(before)
    assert threads[1::2] == ["policy-pool_0"] * 4 and threads[0::2] == ["MainThread"] * 4
    for (name, a), (_, b) in zip(summed[0].named_parameters(), concurrent[0].named_parameters()):
        assert torch.equal(a, b), name
    assert not torch.equal(summed[0].critic.weights[0], nets_and_adam()[0].critic.weights[0])


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


def test_a_run_with_concurrent_losses_learns_what_one_thread_learns_and_leaves_no_thread(
        tmp_path: Path, monkeypatch):
    """--concurrent-losses --n-threads 2: the policy loss runs on the run's pool thread (one
    torch thread each), the weights at the end are bit-equal to a --n-threads 1 run's, and the
    pool's thread is gone when main returns. With --n-threads 1 the flag changes nothing."""
    threads, policy_losses = [], sac.policy_losses
    monkeypatch.setattr(sac, "policy_losses", lambda *a, **k: (
        threads.append(threading.current_thread().name), policy_losses(*a, **k))[1])

    def learned(concurrent: bool, n_threads: int) -> dict[str, torch.Tensor]:
        threads.clear()
        run_dir = Path(sac.main(sac.Config(
            max_frames=96, learning_starts=32, batch_size=16, hidden=16, eval_every=0,
            target_return=None, runs_dir=str(tmp_path), concurrent_losses=concurrent,
            n_threads=n_threads))["run_dir"])
        assert len(threads) >= 16 and not any(t.name.startswith("sac-policy-loss")
                                              for t in threading.enumerate())
        return torch.load(run_dir / "checkpoints" / "latest.pt")["learner"]

    before = torch.get_num_threads()
    try:
        one = learned(False, 1)
        assert set(threads) == {"MainThread"}
        assert learned(True, 1).keys() == one.keys() and set(threads) == {"MainThread"}
        both = learned(True, 2)
        assert set(threads) == {"sac-policy-loss_0"}
    finally:
        torch.set_num_threads(before)
    for name, value in one.items():
        assert torch.equal(value, both[name]), name


def test_the_evaluation_gets_the_weights_of_its_iteration_from_the_function_sac_passes(
        tmp_path: Path, monkeypatch):
    """SAC ends an iteration per frame and hands ``end_iteration`` a function: the actor's
    state_dict is taken only when an evaluation starts, and the evaluation plays those weights."""
    started, start = [], Evaluator.start
    monkeypatch.setattr(Evaluator, "start", lambda self, weights: (
        started.append({k: v.clone() for k, v in weights.items()}), start(self, weights))[1])
    summary = sac.main(sac.Config(
        max_frames=320, learning_starts=32, batch_size=16, hidden=16, eval_every=4,
        eval_envs=2, target_return=None, runs_dir=str(tmp_path)))
    assert len(started) >= 2 and all(set(w) == set(started[0]) for w in started)
    assert all(k.startswith(("body.", "head.")) for k in started[0])  # the actor's own keys
    assert any(not torch.equal(started[0][k], started[-1][k]) for k in started[0])
    assert not math.isnan(summary["eval_return"])


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

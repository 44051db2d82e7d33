"""rlstruct.runs.evaluator.Evaluator: evaluation episodes in a worker process, beside training.

The agent is slowed down (a sleep per step) so that "start() returns at once and the episodes
play meanwhile" is a measurable claim; results are checked against the serial reference.
"""

from __future__ import annotations

import time

import pytest
import torch

from rlstruct import Agent, DictTensor, SerialBatcher
from rlstruct.envs import GymEnv
from rlstruct.errors import DeviceContractError
from rlstruct.runs.episodes import EpisodeTracker
from rlstruct.runs.evaluator import Evaluator

REPEAT = "rlstruct/Repeat-v0"  # 10-step episodes, reward 1 per repeated symbol
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class Scaled(Agent):
    """Repeats the symbol where ``model.weight > 0`` (return 10), else plays the other one
    (return 0); sleeps ``delay`` seconds per step."""

    def __init__(self, model: torch.nn.Module, delay: float = 0.0) -> None:
        self.model, self.delay = model, delay

    def __call__(self, state, observation, agent_info):
        time.sleep(self.delay)
        symbol = observation["frame"].argmax(-1)
        good = bool(self.model.weight.flatten()[0] > 0)
        return DictTensor({"action": symbol if good else 1 - symbol}), state


class Lean(Agent):
    """CartPole: pushes the cart towards the side the pole leans to."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, state, observation, agent_info):
        return DictTensor({"action": (observation["frame"][:, 2] > 0).long()}), state


def model(sign: float) -> torch.nn.Module:
    layer = torch.nn.Linear(1, 1)
    with torch.no_grad():
        layer.weight.fill_(sign)
    return layer


def wait_ready(evaluator: Evaluator, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not evaluator.ready:
        assert time.monotonic() < deadline, "the evaluation worker did not start"
        time.sleep(0.02)


def wait_result(evaluator: Evaluator, timeout: float = 60.0) -> float:
    deadline = time.monotonic() + timeout
    while (result := evaluator.poll()) is None:
        assert time.monotonic() < deadline, "the evaluation did not finish"
        time.sleep(0.01)
    return result


def test_start_returns_at_once_and_the_episodes_play_in_the_worker():
    # 10 steps x 0.05 s: an evaluation takes 0.5 s in the worker.
    with Evaluator(Scaled, {"model": model(1.0), "delay": 0.05}, REPEAT, n_envs=3) as ev:
        wait_ready(ev)
        began = time.monotonic()
        assert ev.start(model(1.0).state_dict())
        assert time.monotonic() - began < 0.3 and ev.busy
        assert ev.poll() is None  # still playing
        assert not ev.start(model(-1.0).state_dict())  # busy: skipped, not queued
        assert wait_result(ev) == 10.0
        assert time.monotonic() - began >= 0.45
        assert not ev.busy and ev.poll() is None and ev.n_started == 1


def test_each_evaluation_plays_the_weights_it_was_started_with():
    with Evaluator(Scaled, {"model": model(1.0)}, REPEAT, n_envs=2) as ev:
        wait_ready(ev)
        for sign, expected in ((-1.0, 0.0), (1.0, 10.0), (-1.0, 0.0)):
            assert ev.start(model(sign).state_dict())
            assert wait_result(ev) == expected


def test_episodes_longer_than_a_segment_and_the_serial_reference():
    # T=3, far fewer steps than an episode: the evaluator plays on until every episode ended.
    with Evaluator(Lean, {"model": model(1.0)}, "CartPole-v1", n_envs=4, seed=7,
                   n_timesteps=3) as ev:
        wait_ready(ev)
        ev.start(model(1.0).state_dict())
        result = wait_result(ev)
    with SerialBatcher(3, Lean, {"model": model(1.0)}, GymEnv,
                       {"env": "CartPole-v1", "n_envs": 4}, seeds=7) as reference:
        reference.reset()
        tracker, returns, n_running = EpisodeTracker(), [], 4
        while n_running:
            reference.execute()
            traj, n_running = reference.get()
            returns += tracker(traj)[0].tolist()
    assert len(returns) == 4 and result == pytest.approx(sum(returns) / 4)


def test_the_agent_args_are_copied_at_construction():
    shared = model(1.0)
    with Evaluator(Scaled, {"model": shared}, REPEAT, n_envs=1) as ev:
        with torch.no_grad():
            shared.weight.fill_(-1.0)  # the learner trains on: the evaluator keeps its copy
        wait_ready(ev)
        ev.start()  # no new weights
        assert wait_result(ev) == 10.0


def test_close_while_the_worker_starts_and_twice():
    ev = Evaluator(Scaled, {"model": model(1.0)}, REPEAT, n_envs=1)
    ev.close()  # waits for the start-up, then stops the worker
    ev.close()
    assert ev.ready


class MetaAction(Scaled):
    """Returns its action on the meta device: a device-contract breach."""

    def __call__(self, state, observation, agent_info):
        action, state = super().__call__(state, observation, agent_info)
        return action.to("meta"), state


def test_check_devices_wraps_the_agent_and_a_failed_start_is_raised_by_the_next_call():
    ev = Evaluator(MetaAction, {"model": model(1.0)}, REPEAT, n_envs=1, check_devices=True)
    try:
        with pytest.raises(DeviceContractError, match=r"action\['action'\] is on meta"):
            wait_ready(ev)
    finally:
        ev.close()

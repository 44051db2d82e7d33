"""Tests of rlstruct.learners.thread.LearnerThread: back-pressure, failure propagation, bounded
stop,
metrics, no leftover thread. Blocking is scripted with events, so only generous upper bounds on
time are asserted (never that something is fast on a loaded machine)."""

from __future__ import annotations

import gc
import itertools
import threading
import time
import traceback
from collections.abc import Callable, Iterator

import pytest
import torch

from rlstruct.errors import BatcherStateError, ConfigError, RLStructError
from rlstruct.learners.thread import LatestWeights, LearnerError, LearnerThread, LearnerTimeoutError

PREFIX = "test-learner-"
_names = itertools.count()

#: Generous bound on "promptly" for a 2-core machine shared with other test runs.
PROMPT_S = 5.0


def new_name() -> str:
    return f"{PREFIX}{next(_names)}"


def learner_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(PREFIX)]


@pytest.fixture(autouse=True)
def no_leftover_learner_threads() -> Iterator[None]:
    """Every test must leave no learner thread behind (after its own clean-up ran)."""
    yield
    for t in learner_threads():
        t.join(PROMPT_S)
    alive = [t.name for t in learner_threads()]
    assert not alive, f"learner threads left alive: {alive}"


class Gate:
    """A ``learn`` that records each batch, then waits until released (30 s at most)."""

    def __init__(self) -> None:
        self.seen: list[object] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, batch: object) -> dict[str, float]:
        self.seen.append(batch)
        self.started.set()
        self.release.wait(30.0)
        return {"batch": float(len(self.seen) - 1)}


def wait_dead(learner: LearnerThread) -> None:
    deadline = time.perf_counter() + PROMPT_S
    while learner.running and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert not learner.running


# ----------------------------------------------------------------------------------------------
# Back-pressure


def test_put_blocks_while_full_then_proceeds_or_times_out():
    gate = Gate()
    learner = LearnerThread(gate, max_queue=1, name=new_name())
    try:
        learner.put(0)
        assert gate.started.wait(PROMPT_S)  # batch 0 is inside learn, the queue is empty
        learner.put(1)  # takes the only slot
        t0 = time.perf_counter()
        with pytest.raises(
            LearnerTimeoutError,
            match=r"put waited 0.2 s for a free slot .*max_queue=1.*running on batch 0",
        ):
            learner.put(2, timeout=0.2)
        assert 0.2 <= time.perf_counter() - t0 < PROMPT_S
        with pytest.raises(LearnerTimeoutError, match=r"put waited 0 s"):
            learner.put(2, timeout=0)
        assert isinstance(LearnerTimeoutError("x"), TimeoutError)

        # A put without a short timeout blocks until learn frees a slot.
        done = threading.Event()
        failures: list[BaseException] = []

        def producer() -> None:
            try:
                learner.put(2, timeout=30.0)
                done.set()
            except BaseException as exc:  # noqa: BLE001 - shown by the assertion below
                failures.append(exc)

        thread = threading.Thread(target=producer)
        thread.start()
        assert not done.wait(0.3)  # cannot finish: learn is held and the slot taken
        gate.release.set()
        assert done.wait(PROMPT_S), failures
        thread.join(PROMPT_S)
        learner.wait_idle(PROMPT_S)
        assert gate.seen == [0, 1, 2]
        m = learner.metrics()
        assert m["batches_put"] == 3 and m["batches_learned"] == 3  # timed-out puts don't count
        assert m["put_wait_ms_mean"] > 0
    finally:
        gate.release.set()
        learner.stop(PROMPT_S)


def test_blocked_put_raises_at_once_when_learn_fails():
    release = threading.Event()

    def learn(batch: int) -> None:
        release.wait(30.0)
        raise RuntimeError(f"learn broke on {batch}")

    learner = LearnerThread(learn, max_queue=1, name=new_name())
    learner.put(0)
    learner.put(1)  # fills the queue once batch 0 is taken, or waits for it (< PROMPT_S)
    timer = threading.Timer(0.2, release.set)
    timer.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(LearnerError, match=r"RuntimeError on batch 0 .*learn broke on 0"):
            learner.put(2, timeout=30.0)  # blocked on the full queue when learn fails
        assert time.perf_counter() - t0 < PROMPT_S  # not the 30 s of the put's deadline
    finally:
        timer.cancel()
        release.set()
        learner.stop(PROMPT_S)


# ----------------------------------------------------------------------------------------------
# Failures of learn


def failing_learn(batch: int) -> dict[str, float]:
    if batch == 2:
        raise ValueError(f"boom on {batch}")
    return {"loss": float(batch)}


INTERACTIONS: dict[str, Callable[[LearnerThread], object]] = {
    "put": lambda learner: learner.put(99),
    "metrics": lambda learner: learner.metrics(),
    "stop": lambda learner: learner.stop(PROMPT_S),
    "raise_if_failed": lambda learner: learner.raise_if_failed(),
    "wait_idle": lambda learner: learner.wait_idle(PROMPT_S),
}


@pytest.mark.parametrize("interaction", sorted(INTERACTIONS))
def test_learn_error_is_reraised_with_original_traceback(interaction):
    learner = LearnerThread(failing_learn, max_queue=4, name=new_name())
    try:
        for k in range(4):
            learner.put(k)
        wait_dead(learner)  # the failure happened before the interaction
        with pytest.raises(LearnerError, match=r"learn raised ValueError on batch 2 .*boom on 2"):
            INTERACTIONS[interaction](learner)
    finally:
        learner.stop(PROMPT_S)  # already reported: returns quietly
    learner.stop(PROMPT_S)  # idempotent
    err = learner.error
    assert isinstance(err, ValueError) and str(err) == "boom on 2"

    with pytest.raises(LearnerError) as info:  # put keeps raising: the learner is dead
        learner.put(100)
    exc = info.value
    assert isinstance(exc, RLStructError) and isinstance(exc, RuntimeError)
    assert exc.batch == 2 and exc.exc_type == "ValueError"
    assert exc.__cause__ is err
    frames = traceback.extract_tb(err.__traceback__)
    assert frames[-1].name == "failing_learn"
    assert frames[-1].line == 'raise ValueError(f"boom on {batch}")'
    text = "".join(traceback.format_exception(exc))
    assert "The above exception was the direct cause of the following exception" in text
    assert 'raise ValueError(f"boom on {batch}")' in text
    assert exc.learner_traceback is not None and "in failing_learn" in exc.learner_traceback

    m = learner.metrics()  # readable after the failure was reported
    assert m["batches_learned"] == 2 and m["learn/loss"] == 1.0
    assert m["batches_dropped"] == 1  # batch 3, queued behind the failure


def test_learn_returning_a_non_mapping_is_an_error():
    learner = LearnerThread(lambda batch: [1.0, 2.0], name=new_name())
    learner.put("x")
    with pytest.raises(LearnerError, match=r"TypeError on batch 0 .*Mapping.*got list"):
        learner.wait_idle(PROMPT_S)
    learner.stop(PROMPT_S)


def test_unreported_error_is_raised_by_stop_once():
    learner = LearnerThread(failing_learn, max_queue=4, name=new_name())
    for k in range(3):
        learner.put(k)
    wait_dead(learner)
    with pytest.raises(LearnerError, match="batch 2"):
        learner.stop(PROMPT_S)
    learner.stop(PROMPT_S)
    with pytest.raises(LearnerError, match="batch 2"):  # explicit checks always raise
        learner.raise_if_failed()


# ----------------------------------------------------------------------------------------------
# Stop


def test_stop_is_bounded_and_idempotent_while_learn_runs_long():
    gate = Gate()  # holds learn for up to 30 s
    name = new_name()
    learner = LearnerThread(gate, max_queue=2, name=name)
    try:
        learner.put(0)
        assert gate.started.wait(PROMPT_S)
        learner.put(1)
        learner.put(2)
        for timeout in (0.5, 0.2):  # twice: idempotent, and bounded each time
            t0 = time.perf_counter()
            with pytest.raises(
                LearnerTimeoutError,
                match=rf"'{name}' is still running {timeout:g} s after stop\(\): learn has been "
                r"running on batch 0",
            ):
                learner.stop(timeout=timeout)
            assert timeout <= time.perf_counter() - t0 < PROMPT_S
            assert learner.running
        with pytest.raises(BatcherStateError, match=r"put after stop\(\)"):
            learner.put(3)
        with pytest.raises(LearnerTimeoutError, match=r"0 batch\(es\)|1 batch\(es\)"):
            learner.wait_idle(0.1)  # batch 0 is still inside learn
    finally:
        gate.release.set()
    learner.stop(PROMPT_S)
    learner.stop(PROMPT_S)
    assert not learner.running
    assert name not in [t.name for t in threading.enumerate()]
    assert gate.seen == [0]  # stop drops what is queued: 1 and 2 were never learned
    m = learner.metrics()
    assert m["batches_learned"] == 1 and m["batches_dropped"] == 2
    learner.wait_idle(PROMPT_S)  # nothing pending any more: learned + dropped == put


def test_context_manager_stops_the_thread():
    seen: list[int] = []
    with LearnerThread(seen.append, name=new_name()) as learner:
        for k in range(3):
            learner.put(k)
        learner.wait_idle(PROMPT_S)
        assert learner.running
    assert not learner.running
    assert seen == [0, 1, 2]
    with pytest.raises(BatcherStateError):
        learner.put(3)


def test_context_manager_raises_an_unreported_learn_error():
    with (
        pytest.raises(LearnerError, match="batch 2"),
        LearnerThread(failing_learn, max_queue=4, name=new_name()) as learner,
    ):
        for k in range(3):
            learner.put(k)
        wait_dead(learner)


def test_context_manager_keeps_the_body_exception_and_notes_the_learner_one():
    with (
        pytest.raises(KeyError, match="body") as info,
        LearnerThread(failing_learn, max_queue=4, name=new_name()) as learner,
    ):
        for k in range(3):
            learner.put(k)
        wait_dead(learner)
        raise KeyError("body")
    notes = getattr(info.value, "__notes__", [])
    if hasattr(info.value, "add_note"):  # Python >= 3.11
        assert any("learn raised ValueError on batch 2" in n for n in notes), notes


def test_finalizer_stops_the_thread_when_the_owner_is_dropped():
    name = new_name()
    learner = LearnerThread(lambda batch: None, name=name)
    learner.put(0)
    learner.wait_idle(PROMPT_S)
    (thread,) = [t for t in threading.enumerate() if t.name == name]
    assert thread.daemon
    del learner
    gc.collect()
    thread.join(PROMPT_S)
    assert not thread.is_alive()


# ----------------------------------------------------------------------------------------------
# Metrics


def test_metrics_on_a_scripted_run():
    learner: LearnerThread | None = None

    def learn(batch: int) -> dict[str, object]:
        time.sleep(0.01)
        if batch % 2 == 0:
            assert learner is not None
            learner.count_publication()
        return {"loss": batch * 1.5, "scalar_tensor": torch.tensor(2.0)}

    learner = LearnerThread(learn, max_queue=2, name=new_name())
    try:
        for k in range(5):
            learner.put(k, size=32)
        learner.wait_idle(PROMPT_S)
        m = learner.metrics()
    finally:
        learner.stop(PROMPT_S)
    assert m["batches_put"] == 5 and m["batches_learned"] == 5 and m["batches_dropped"] == 0
    assert m["items_put"] == 160 and m["items_learned"] == 160
    assert 9.5 <= m["learn_ms_mean"] < 2000  # sleep(0.01) never returns early
    assert 9.5 <= m["learn_ms_last"] < 2000
    assert m["publications"] == 3  # batches 0, 2, 4
    assert m["learn/loss"] == 6.0 and m["learn/scalar_tensor"] == 2.0
    assert 0 <= m["queue_size_mean"] <= m["queue_size_max"] <= 2
    assert m["queue_size_p50"] <= m["queue_size_p90"] <= m["queue_size_max"]
    assert m["dequeue_wait_ms_mean"] >= 0 and m["put_wait_ms_mean"] >= 0
    assert 0 < m["sample_per_s"] < float("inf") and 0 < m["train_per_s"] < float("inf")
    # The items learned took at least 5 x 10 ms, so the train rate is at most 160 / 0.05 s.
    assert m["train_per_s"] <= 160 / 0.05
    assert all(isinstance(v, float) for v in m.values())


def test_queue_size_quantiles_are_exact_on_a_scripted_queue():
    gate = Gate()
    learner = LearnerThread(gate, max_queue=3, name=new_name())
    try:
        assert learner.metrics()["queue_size_max"] == 0.0  # empty window
        learner.put(0)  # finds 0 queued
        assert gate.started.wait(PROMPT_S)
        for k in (1, 2, 3):  # find 0, 1, 2 queued: batch 0 is held inside learn
            learner.put(k)
        m = learner.metrics()
        gate.release.set()
        learner.wait_idle(PROMPT_S)
    finally:
        gate.release.set()
        learner.stop(PROMPT_S)
    # sizes 0, 0, 1, 2: mean 0.75, median 0.5, p90 at position 2.7 -> 1 + 0.7 * (2 - 1) = 1.7
    assert m["queue_size_mean"] == pytest.approx(0.75)
    assert m["queue_size_p50"] == pytest.approx(0.5)
    assert m["queue_size_p90"] == pytest.approx(1.7)
    assert m["queue_size_max"] == 2.0
    assert m["batches_learned"] == 0 and m["batches_put"] == 4


def test_window_bounds_the_windowed_metrics():
    gate = Gate()
    learner = LearnerThread(gate, max_queue=3, name=new_name(), window=2)
    try:
        learner.put(0)
        assert gate.started.wait(PROMPT_S)
        for k in (1, 2, 3):  # queue sizes 0, 0, 1, 2: the window keeps 1, 2
            learner.put(k)
        m = learner.metrics()
    finally:
        gate.release.set()
        learner.stop(PROMPT_S)
    assert m["queue_size_mean"] == pytest.approx(1.5) and m["queue_size_p50"] == 1.5
    assert m["batches_put"] == 4  # counts are not windowed


# ----------------------------------------------------------------------------------------------
# Errors in the arguments


def test_config_errors():
    with pytest.raises(ConfigError, match="learn must be callable, got int"):
        LearnerThread(3)  # type: ignore[arg-type]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match=r"max_queue must be an integer >= 1"):
            LearnerThread(print, max_queue=bad)  # type: ignore[arg-type]
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match=r"put_timeout must be a finite number of seconds"):
            LearnerThread(print, put_timeout=bad)
    with pytest.raises(ConfigError, match=r"window must be an integer >= 1, got 0"):
        LearnerThread(print, window=0)
    assert not learner_threads()  # a rejected configuration starts no thread


def test_call_errors():
    learner = LearnerThread(lambda batch: None, name=new_name())
    try:
        with pytest.raises(ConfigError, match=r"timeout must be a finite number of seconds >= 0"):
            learner.put(0, timeout=-1.0)
        with pytest.raises(ConfigError, match=r"timeout must be a finite number"):
            learner.put(0, timeout=float("inf"))  # always a deadline
        with pytest.raises(ConfigError, match=r"size must be an integer >= 0, got -1"):
            learner.put(0, size=-1)
        with pytest.raises(ConfigError, match=r"timeout must be a finite number"):
            learner.stop(timeout=float("nan"))
        assert learner.metrics()["batches_put"] == 0  # nothing was queued by the bad calls
    finally:
        learner.stop(PROMPT_S)


def test_latest_weights_hands_over_cpu_copies_of_the_newest_put_once():
    box = LatestWeights()
    model = torch.nn.Linear(3, 2)
    assert box.take() is None and box.published == 0
    box.put(model.state_dict())
    with torch.no_grad():
        model.weight.add_(1.0)  # the learner goes on training: the published copy must not move
    box.put(model.state_dict())
    with torch.no_grad():
        model.weight.add_(1.0)
    weights = box.take()
    assert weights is not None and box.take() is None and box.published == 2
    torch.testing.assert_close(weights["weight"], model.weight.detach() - 1.0)  # the newest put
    assert not weights["weight"].requires_grad and weights["weight"].device.type == "cpu"


def test_latest_weights_from_a_learner_thread_are_taken_by_the_owner():
    box = LatestWeights()
    model = torch.nn.Linear(2, 1)

    def learn(batch: float) -> None:
        with torch.no_grad():
            model.bias.fill_(batch)
        box.put(model.state_dict())

    with LearnerThread(learn, max_queue=1, name=new_name()) as learner:
        for k in range(5):
            learner.put(float(k))
        learner.wait_idle(PROMPT_S * 10)
    weights = box.take()
    assert weights is not None and float(weights["bias"]) == 4.0 and box.published == 5

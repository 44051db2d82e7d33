"""in_threads: parts of a learner at once, errors named, every wait bounded (APPO's use of it:
tests/test_algo_appo.py)."""

from __future__ import annotations

import threading
import time

import pytest

from rlstruct.errors import LearnerError, LearnerTimeoutError
from rlstruct.learner_parts import in_threads


def test_the_parts_run_at_once_and_their_results_come_back_in_order():
    seen: list[str] = []
    barrier = threading.Barrier(3, timeout=10)  # only passes if all three run at the same time

    def part(name: str):
        def run():
            barrier.wait()
            seen.append(threading.current_thread().name)
            return name
        return run

    assert in_threads([part("a"), part("b"), part("c")], names=["a", "b", "c"]) == ["a", "b", "c"]
    assert threading.main_thread().name in seen and "rlstruct-b" in seen and "rlstruct-c" in seen


def test_a_failing_part_is_named_and_the_others_are_waited_for():
    done = []

    def slow():
        time.sleep(0.2)
        done.append(1)

    with pytest.raises(LearnerError, match="the critic part of the learner raised ValueError: "
                                           "bad target") as info:
        in_threads([slow, lambda: (_ for _ in ()).throw(ValueError("bad target"))],
                   names=["actor", "critic"])
    assert done == [1] and isinstance(info.value.__cause__, ValueError)
    assert info.value.exc_type == "ValueError" and "bad target" in info.value.learner_traceback


def test_a_part_that_does_not_finish_times_out():
    release = threading.Event()
    start = time.monotonic()
    try:
        with pytest.raises(LearnerTimeoutError, match=r"the critic part .* within 0.3 s"):
            in_threads([lambda: None, lambda: release.wait(30)], names=["actor", "critic"],
                       timeout=0.3)
        assert time.monotonic() - start < 5
    finally:
        release.set()


def test_names_must_match_the_parts():
    with pytest.raises(ValueError, match="2 parts but 1 names"):
        in_threads([lambda: 1, lambda: 2], names=["actor"])

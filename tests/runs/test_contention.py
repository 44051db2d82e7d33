"""The warning of a run starved of cores by other jobs: the rule on synthetic monitor rows."""

from __future__ import annotations

import io

import pytest

from rlstruct.runs.contention import ContentionWatch, asked_cores
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.progress import ProgressLine


def rows(busy: float, load: float, start: float = 0.0, stop: float = 120.0, every: float = 5.0):
    """Progress rows every ``every`` seconds of run time with these monitor figures."""
    t = start
    while t < stop:
        yield {"wall_time": t, "cores_busy": busy, "load_avg": load}
        t += every


def warnings_of(watch: ContentionWatch, samples) -> list[tuple[float, str]]:
    return [(row["wall_time"], w) for row in samples if (w := watch.update(row)) is not None]


def test_a_starved_run_on_a_loaded_machine_warns_once_naming_the_remedies():
    """The issue's case: PPO on Pong, 2 learner threads and 2 workers on 2 cores, load 3-5."""
    watch = ContentionWatch(asked=4, cores=2, n_threads=2)
    found = warnings_of(watch, rows(busy=0.4, load=4.0))
    assert len(found) == 1  # one time only, however long it lasts
    at, text = found[0]
    assert at == 40.0  # the first 10 s are skipped, then 30 s of stall
    assert "--n-threads 1 (now 2)" in text and "rlstruct tune" in text
    assert "load average was 4.0 on 2 cores" in text and "0.4 cores busy" in text


@pytest.mark.parametrize("busy, load", [
    (0.3, 1.0),  # a quiet machine: the run waits on something else, not on other jobs
    (0.3, 2.0),  # load at the cores, not above
    (1.9, 5.0),  # a loaded machine, but the run gets its cores
    (1.2, 4.0),  # more than half the cores it asks for (min(4, 2) = 2): no stall
])
def test_no_warning_unless_both_the_machine_is_loaded_and_the_run_starved(busy, load):
    watch = ContentionWatch(asked=4, cores=2, n_threads=2)
    assert warnings_of(watch, rows(busy, load, stop=600.0)) == []


def test_a_run_that_asks_more_than_the_machine_has_but_keeps_it_busy_does_not_warn():
    # 8 workers on 2 cores: the run alone makes the load exceed the cores
    watch = ContentionWatch(asked=asked_cores(LayoutConfig(n_processes=8), 1, cores=2), cores=2)
    assert watch.asked == 9
    assert warnings_of(watch, rows(busy=2.0, load=9.0)) == []
    assert warnings_of(watch, rows(busy=0.5, load=9.0, start=120.0, stop=200.0))  # starved


def test_the_stall_must_last_without_a_break():
    watch = ContentionWatch(asked=3, cores=2, n_threads=2)
    samples = []
    for start in range(0, 300, 25):  # 20 s stalled, then one good row, again and again
        samples += list(rows(0.3, 4.0, start, start + 20.0))
        samples.append({"wall_time": start + 20.0, "cores_busy": 1.8, "load_avg": 4.0})
    assert warnings_of(watch, samples) == []
    # and at least min_rows rows: two rows 60 s apart are not enough
    watch = ContentionWatch(asked=3, cores=2)
    assert warnings_of(watch, [{"wall_time": t, "cores_busy": 0.2, "load_avg": 5.0}
                               for t in (0.0, 20.0, 80.0)]) == []


def test_rows_without_monitor_figures_and_unjudged_runs_never_warn():
    nan = float("nan")
    watch = ContentionWatch(asked=3, cores=2)
    assert warnings_of(watch, rows(busy=nan, load=4.0)) == []
    assert warnings_of(watch, rows(busy=0.2, load=nan)) == []
    assert warnings_of(ContentionWatch(asked=None, cores=2), rows(busy=0.2, load=4.0)) == []


def test_one_learner_thread_names_tune_only():
    (_, text), = warnings_of(ContentionWatch(asked=3, cores=2, n_threads=1),
                             rows(busy=0.2, load=4.0))
    assert "--n-threads" not in text and "rlstruct tune" in text


def test_the_cores_a_layout_asks_for():
    assert asked_cores(LayoutConfig(), 2) == 4  # 2 workers and 2 learner threads
    assert asked_cores(LayoutConfig(n_processes=1), 2) == 2  # collects in the learner's process
    assert asked_cores(LayoutConfig(n_processes=1, pipeline=2), 1) == 2  # one worker
    assert asked_cores(LayoutConfig(n_processes=0), 1, cores=6) == 7  # one worker per core
    assert asked_cores(LayoutConfig(), 4, learner_on_cpu=False) == 3  # a GPU learner: 1 core
    assert asked_cores(LayoutConfig(batcher_device="cuda:0", n_processes=1), 1) == 1
    assert asked_cores(LayoutConfig(n_learners=2), 2) == 6
    assert asked_cores(LayoutConfig(backend="ray"), 2) is None  # actors may run elsewhere


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_warning_is_a_line_of_its_own_in_the_progress_output():
    tty = FakeTTY()
    line = ProgressLine("ppo", "r", stream=tty)
    row = {"frames": 10, "wall_time": 1.0, "steps_per_s": 10.0, "r": 0.0}
    line.show(row, float("nan"), now=0.0, force=True)
    line.warn("rlstruct: warning: starved")
    line.show(row, float("nan"), now=1.0, force=True)
    before, warning, after = tty.getvalue().split("\n")
    assert before.startswith("\rppo") and warning == "rlstruct: warning: starved"
    assert after.startswith("\rppo")


def test_a_run_judges_its_progress_rows_and_warns_in_its_output(tmp_path, capsys, monkeypatch):
    from rlstruct.runs.run import Run, RunConfig

    cfg = RunConfig(env_id="CartPole-v1", n_threads=2, eval_every=0, progress_every_s=0.0,
                    runs_dir=str(tmp_path / "runs"),
                    layout=LayoutConfig(learner_device="cpu", n_processes=1, n_envs=2))
    with Run("test", cfg) as run:
        assert run.contention.asked == 2 and run.contention.n_threads == 2
        run.contention = ContentionWatch(asked=2, cores=2, n_threads=2, min_span_s=0.0,
                                         min_rows=2, skip_s=0.0)
        monkeypatch.setattr(run.monitor, "sample",
                            lambda frames: {"cores_busy": 0.1, "load_avg": 6.0})
        for _ in range(4):
            run.end_iteration(None)
    err = capsys.readouterr().err
    assert err.count("rlstruct: warning: ") == 1 and "--n-threads 1 (now 2)" in err

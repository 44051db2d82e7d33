"""The layout autotuner: search logic on fake measurements, layout files, one small real tune."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest
import torch
from support.tune_helpers import learn_on_one_batch

from rlstruct.batchers.make import make_batcher
from rlstruct.errors import ConfigError
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.layout_file import apply_layout, layout_from_json, read_layout, write_layout
from rlstruct.runs.run import RunConfig
from rlstruct.tools.tune import (
    AXES,
    AlgoSetup,
    BatcherMeasure,
    Candidate,
    Measurement,
    candidate_grid,
    grid_search,
    main,
    search,
    tune_algo,
    tuned_layout,
)
from rlstruct.tools.tune.candidates import thread_options
from rlstruct.tools.tune.searches import paired_winner

GRID = candidate_grid(processes=(1, 2, 4), n_envs_options=(8, 16, 32, 64),
                      n_timesteps_options=(16, 32, 64), pipelines=(1, 2), devices=())


def speed(c: Candidate) -> float:
    """A deterministic landscape with one interior optimum: 2 workers, 32 envs, T=32, pipe2."""
    workers = {1: 1.0, 2: 1.8, 4: 1.5}[c.n_processes]
    envs = {8: 0.5, 16: 0.8, 32: 1.0, 64: 0.9}[c.n_envs]
    steps = {16: 0.85, 32: 1.0, 64: 0.95}[c.n_timesteps]
    return 10_000 * workers * envs * steps * (1.1 if c.pipeline == 2 else 1.0)


class FakeMeasure:
    """Deterministic measurements: ``steps = speed * seconds``; each costs ``overhead`` more."""

    def __init__(self, landscape=speed, overhead: float = 0.3, cores=None, fail=(),
                 first_bonus=None) -> None:
        self.landscape, self.overhead, self.fail = landscape, overhead, set(fail)
        self.cores = cores or (lambda c: float(c.n_processes))
        self.first_bonus = first_bonus or {}  # candidate -> factor on its first measurement
        self.calls: list[tuple[Candidate, float]] = []

    def __call__(self, c: Candidate, seconds: float) -> Measurement:
        first = all(c != done for done, _ in self.calls)
        self.calls.append((c, seconds))
        if c in self.fail:
            return Measurement(c, 0, 0.0, math.nan, math.nan, self.overhead, "MemoryError: no")
        factor = self.first_bonus.get(c, 1.0) if first else 1.0
        steps = int(self.landscape(c) * factor * seconds)
        return Measurement(c, steps, seconds, self.cores(c) * seconds, 0.1,
                           seconds + self.overhead)


def true_best(candidates, key=speed) -> Candidate:
    return max(candidates, key=key)


# ----------------------------------------------------------------------------- candidates
def test_candidate_grid_is_valid_and_complete():
    assert len(GRID) == 4 * 3 * (1 + 2 * 2)  # serial (pipe 1) + P in {2, 4} x pipe {1, 2}
    assert not [c for c in GRID if c.n_processes == 1 and c.pipeline > 1]
    assert len(set(GRID)) == len(GRID)
    gpu = candidate_grid(processes=(1, 2), n_envs_options=(8,), n_timesteps_options=(16,),
                         pipelines=(1,), devices=("cuda:0",))
    assert Candidate(1, 8, 16, 1, "cuda:0") in gpu and len(gpu) == 3


@pytest.mark.parametrize("bad", [dict(n_processes=1, pipeline=2), dict(n_envs=0),
                                 dict(n_processes=2, device="cuda:0")])
def test_invalid_candidates_are_refused(bad):
    args = dict(n_processes=2, n_envs=8, n_timesteps=16) | bad
    with pytest.raises(ConfigError):
        Candidate(**args)


def test_candidate_layout_and_label():
    c = Candidate(2, 32, 64, 2)
    layout = c.layout(LayoutConfig(learner_device="cpu", check_devices=True))
    assert (layout.n_processes, layout.n_envs, layout.pipeline) == (2, 32, 2)
    assert layout.learner_device == "cpu" and layout.check_devices
    assert c.label == "Batcher 2x32 T=64 pipe2"
    assert Candidate(1, 8, 16).label == "Serial cpu 8 T=16"


# ----------------------------------------------------------------------------- the search
def test_grid_measures_every_candidate_once_and_picks_the_best():
    fake = FakeMeasure()
    result = grid_search(GRID, fake, seconds=1.0)
    assert sorted(c for c, _ in fake.calls) == sorted(GRID)
    assert result.best == true_best(GRID) == Candidate(2, 32, 32, 2)
    assert result.spent_s == pytest.approx(len(GRID) * 1.3)


def test_search_finds_the_best_with_far_fewer_measurements():
    fake = FakeMeasure()
    result = search(GRID, fake, budget_s=30.0, probe_s=0.5)
    assert result.best == true_best(GRID)
    assert len(fake.calls) == result.n_measurements
    assert len(fake.calls) < len(GRID) / 2
    assert len(result.stats) < len(GRID) / 2  # distinct candidates measured
    assert result.spent_s <= 30.0


@pytest.mark.parametrize("start", [Candidate(1, 8, 16), Candidate(4, 64, 64, 2)])
def test_search_finds_the_best_of_other_landscapes(start):
    # the optimum in a corner of the grid: the search must walk there
    def corner(c: Candidate) -> float:
        return 1000 * (c.n_processes * 10 + c.n_envs / 8 + c.n_timesteps / 16 + c.pipeline
                if start.n_processes == 4 else 1e7 / (c.n_processes * c.n_envs
                                                       * c.n_timesteps * c.pipeline))

    fake = FakeMeasure(landscape=corner)
    result = search(GRID, fake, budget_s=60.0, probe_s=0.5)
    assert result.best == start == true_best(GRID, corner)


@pytest.mark.parametrize("budget", [3.0, 5.0, 8.0, 13.0, 40.0])
def test_search_respects_the_budget(budget):
    fake = FakeMeasure(overhead=0.4)
    result = search(GRID, fake, budget_s=budget, probe_s=0.5, overhead_guess_s=0.4)
    spent = sum(s + 0.4 for _, s in fake.calls)
    assert spent == pytest.approx(result.spent_s)
    assert spent <= budget
    assert result.best in result.stats


def test_default_probe_fits_the_budget():
    fake = FakeMeasure(overhead=0.5)
    result = search(GRID, fake, budget_s=20.0)
    assert result.spent_s <= 20.0
    assert result.best == true_best(GRID)
    # The finals ran: the finalists were measured in 2 rounds after their probe.
    assert max(len(s.measurements) for s in result.stats.values()) == 3


def test_too_small_a_budget_is_an_error():
    with pytest.raises(ConfigError, match="budget"):
        search(GRID, FakeMeasure(), budget_s=0.2, probe_s=0.5)


def test_finals_correct_a_lucky_first_measurement():
    # 4 workers measure 1.5x too fast once (a quiet moment on a shared machine): the finals
    # measure the leaders again and the true best wins.
    lucky = Candidate(4, 32, 32, 2)
    fake = FakeMeasure(first_bonus={lucky: 1.5})
    result = search(GRID, fake, budget_s=40.0, probe_s=0.5)
    assert [c for c, _ in fake.calls].count(lucky) == 3  # its probe and 2 rounds of finals
    assert result.best == true_best(GRID)


def test_steps_per_cpu_second_objective():
    # one worker process uses one core: the most efficient per CPU-second is a serial layout
    fake = FakeMeasure()
    result = search(GRID, fake, budget_s=40.0, probe_s=0.5, objective="steps_per_cpu_s")
    efficiency = {c: speed(c) / c.n_processes for c in GRID}
    assert result.best == max(efficiency, key=efficiency.get)
    assert result.best.n_processes == 1
    with pytest.raises(ConfigError, match="objective"):
        search(GRID, fake, budget_s=10.0, objective="speed")


def test_failed_candidates_lose_and_are_reported():
    best = true_best(GRID)
    fake = FakeMeasure(fail={best})
    result = search(GRID, fake, budget_s=40.0, probe_s=0.5)
    assert best in result.stats and result.stats[best].error is not None
    assert result.best != best
    assert "failed: MemoryError" in result.table()


def test_table_lists_measured_candidates_best_first():
    result = search(GRID, FakeMeasure(), budget_s=20.0, probe_s=0.5)
    lines = result.table().splitlines()
    assert "steps/s" in lines[0] and "cores busy" in lines[0] and "start-up" in lines[0]
    assert lines[1].startswith("*") and result.best.label in lines[1]
    assert len(lines) == 1 + len(result.stats)


def test_axes_cover_every_field_of_a_candidate():
    names = {f.name for f in dataclasses.fields(Candidate)}
    assert names == {"n_processes", "device", "n_envs", "n_timesteps", "pipeline", "n_threads"}
    assert AXES == ("workers", "n_envs", "n_timesteps", "pipeline", "n_threads")


# ----------------------------------------------------------------------------- learner threads
def test_the_grid_has_a_learner_threads_axis():
    assert thread_options(1) == [1] and thread_options(6) == [1, 2, 4, 6]
    grid = candidate_grid(processes=(1, 2), n_envs_options=(8,), n_timesteps_options=(16,),
                          pipelines=(1,), devices=(), n_threads_options=(1, 2))
    assert sorted((c.n_processes, c.n_threads) for c in grid) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert Candidate(2, 8, 16, n_threads=2).label == "Batcher 2x8 T=16 thr2"
    assert Candidate(2, 8, 16).label == "Batcher 2x8 T=16"
    with pytest.raises(ConfigError, match="n_threads must be >= 1"):
        Candidate(1, 8, 16, n_threads=0)


def test_the_search_finds_the_learner_threads_that_a_loaded_machine_wants():
    """A shared machine: a second learner thread halves the speed (the Pong case of issue 41)."""
    grid = candidate_grid(processes=(1, 2, 4), n_envs_options=(8, 16, 32, 64),
                          n_timesteps_options=(16, 32, 64), pipelines=(1, 2), devices=(),
                          n_threads_options=(1, 2))

    def loaded(c):
        return speed(c) * (1.0 if c.n_threads == 1 else 0.5)

    result = search(grid, FakeMeasure(loaded), budget_s=40.0, probe_s=0.5)
    assert result.best.n_threads == 1 and result.best.label == "Batcher 2x32 T=32 pipe2"
    result = search(grid, FakeMeasure(lambda c: speed(c) * c.n_threads), budget_s=40.0,
                    probe_s=0.5)
    assert result.best.n_threads == 2


def test_each_candidate_is_measured_under_its_learner_threads():
    from rlstruct.envs import GymEnvInf

    seen = []
    measure = BatcherMeasure(_agent, {}, GymEnvInf, {"env": "CartPole-v1"},
                             learn=lambda traj: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    assert measure(Candidate(1, 2, 8, n_threads=2), 0.01).error is None
    assert seen and set(seen) == {2}
    seen.clear()
    assert measure(Candidate(1, 2, 8, n_threads=1), 0.01).error is None
    assert set(seen) == {1} and torch.get_num_threads() == before


def test_the_layout_file_carries_the_learner_threads(tmp_path):
    path = write_layout(tmp_path / "tune.json", tuned_layout(Candidate(2, 8, 16, n_threads=3)))
    assert json.loads(path.read_text())["n_threads"] == 3
    assert read_layout(path).n_threads == 3
    cfg = apply_layout(RunConfig(n_threads=2), path)
    assert cfg.n_threads == 3 and cfg.n_timesteps == 16
    # a file without n_threads (an older tuner's, or written by hand) keeps the config's
    older = tmp_path / "older.json"
    older.write_text('{"n_envs": 4, "n_timesteps": 8}')
    assert read_layout(older).n_threads == 0
    assert apply_layout(RunConfig(n_threads=2), older).n_threads == 2


# ----------------------------------------------------------------------------- layout files
def test_layout_file_round_trip(tmp_path):
    result = search(GRID, FakeMeasure(), budget_s=20.0, probe_s=0.5)
    base = LayoutConfig(learner_device="cpu", eval_device="cpu", check_devices=True)
    path = write_layout(tmp_path / "tune.json", tuned_layout(result, base, algo="ppo"))
    data = json.loads(path.read_text())
    assert data["n_timesteps"] == result.best.n_timesteps
    assert data["tuned"]["algo"] == "ppo" and data["tuned"]["steps_per_s"] > 0
    tuned = read_layout(path)
    assert tuned.layout == result.best.layout(base)
    assert layout_from_json(path) == tuned.layout
    assert tuned.n_timesteps == result.best.n_timesteps

    cfg = RunConfig(n_timesteps=7, layout=LayoutConfig(learner_device="cpu", n_envs=3))
    apply_layout(cfg, path)
    assert (cfg.layout.n_processes, cfg.layout.n_envs, cfg.layout.pipeline) == (
        result.best.n_processes, result.best.n_envs, result.best.pipeline)
    assert cfg.n_timesteps == result.best.n_timesteps
    assert cfg.layout.learner_device == "cpu" and not cfg.layout.check_devices  # not tuned


def test_layout_file_feeds_make_batcher(tmp_path):
    from rlstruct.envs import GymEnvInf

    path = write_layout(tmp_path / "tune.json", tuned_layout(Candidate(1, 3, 5)))
    tuned = read_layout(path)
    with make_batcher(**tuned.batcher_kwargs(), create_agent=_agent, agent_args={},
                      create_env=GymEnvInf,
                      env_args={"env": "CartPole-v1", "n_envs": tuned.layout.n_envs},
                      seeds=0) as batcher:
        batcher.reset()
        batcher.execute()
        traj, _ = batcher.get()
    assert traj.trajectories.n_elems() == 3
    assert traj.lengths.max() == 5


def _agent():
    import torch

    from rlstruct import Agent, DictTensor

    class Zero(Agent):
        def __call__(self, state, observation, agent_info):
            n = observation.n_elems()
            return DictTensor({"action": torch.zeros(n, dtype=torch.long)}), state

    return Zero()


@pytest.mark.parametrize("content, match", [
    ('{"n_envs": 8, "colour": 1}', "unknown layout keys"),
    ('{"n_envs": "8"}', "n_envs must be a int"),
    ('{"n_timesteps": 0}', "n_timesteps"),
    ('{"n_threads": 0}', "n_threads must be an int >= 1"),
    ('{"n_threads": 1.5}', "n_threads must be an int >= 1"),
    ("[1, 2]", "JSON object"),
    ("{", "cannot read"),
])
def test_bad_layout_files_are_refused(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        read_layout(path)


# ----------------------------------------------------------------------------- a real tune
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_real_tune_on_cartpole_writes_a_valid_layout(tmp_path, capsys):
    out = tmp_path / "tune.json"
    code = main(["--algo", "rlstruct.algos.tuning:ppo", "--processes", "1,2", "--n-envs", "8",
                 "--n-timesteps", "16", "--pipeline", "1,2", "--devices", "none",
                 "--budget", "10", "--probe-s", "0.2", "--no-learner", "--vary-batch",
                 "-o", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "steps/s" in printed and "cores busy" in printed and str(out) in printed
    tuned = read_layout(out)
    candidates = {Candidate(1, 8, 16), Candidate(2, 8, 16), Candidate(2, 8, 16, 2)}
    pick = Candidate(tuned.layout.n_processes, tuned.layout.n_envs, tuned.n_timesteps,
                     tuned.layout.pipeline, tuned.layout.batcher_device)
    assert pick in candidates
    figures = tuned.tuned
    assert figures["steps_per_s"] > 0 and figures["cores_busy"] > 0
    assert figures["startup_s"] >= 0 and figures["n_measured"] >= 2
    assert figures["spent_s"] <= 10.0 + 3.0  # the budget, plus at most one overrun estimate


def test_finals_keep_their_share_when_overheads_exceed_the_guess():
    fake = FakeMeasure(overhead=1.0)  # a loaded machine: start-ups twice the guess
    result = search(GRID, fake, budget_s=15.0, probe_s=0.5, overhead_guess_s=0.5)
    assert result.spent_s <= 15.0
    assert max(len(s.measurements) for s in result.stats.values()) == 3  # both rounds ran


# ------------------------------------------------------------------- batch size, rounds, learner
def test_candidate_grid_keeps_the_batch_size():
    grid = candidate_grid(processes=(1, 2, 4), batch_size=2048, devices=())
    assert grid and all(c.n_processes * c.n_envs * c.n_timesteps == 2048 for c in grid)
    assert all(16 <= c.n_timesteps <= 64 for c in grid)  # T stays within the options' range
    layouts = {(c.n_processes, c.n_envs) for c in grid}
    assert {(1, 32), (1, 64), (2, 16), (2, 32), (2, 64), (4, 8), (4, 16), (4, 32)} == layouts
    with pytest.raises(ConfigError, match="no layout"):
        candidate_grid(processes=(2,), n_envs_options=(3,), batch_size=1000, devices=())
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        candidate_grid(batch_size=0, devices=())


def _m(c: Candidate, steps_per_s: float) -> Measurement:
    return Measurement(c, int(steps_per_s), 1.0, 1.0, 0.0, 1.0)


def test_paired_winner_compares_within_rounds():
    a, b, c = Candidate(1, 8, 16), Candidate(2, 8, 16), Candidate(2, 16, 16)
    # Round 2 ran at half speed (a busy neighbour): a is best in both rounds, although its
    # round-2 figure is below b's and c's round-1 figures.
    rounds = [{a: _m(a, 1000), b: _m(b, 900), c: _m(c, 800)},
              {a: _m(a, 500), b: _m(b, 450), c: _m(c, 420)}]
    assert paired_winner(rounds, "steps_per_s") == a
    # A failed measurement spoils its round; no complete round: no verdict.
    failed = Measurement(b, 0, 0.0, math.nan, math.nan, 1.0, "MemoryError: no")
    assert paired_winner([{a: _m(a, 1), b: failed}], "steps_per_s") is None
    assert paired_winner([], "steps_per_s") is None
    # The median over 3 rounds outvotes one round spoiled by a spike on a's measurement.
    spiked = [{a: _m(a, 1000), b: _m(b, 950)}, {a: _m(a, 300), b: _m(b, 950)},
              {a: _m(a, 1000), b: _m(b, 950)}]
    assert paired_winner(spiked, "steps_per_s") == a


def test_finals_decide_within_rounds_when_the_load_changes():
    best, second, third = Candidate(2, 32, 32, 2), Candidate(2, 32, 32), Candidate(1, 32, 32)
    seen: dict[Candidate, int] = {}

    def load(c: Candidate) -> float:
        """The best's probe ran while the machine was busy, and so did the second round."""
        k = seen.get(c, 0)
        seen[c] = k + 1
        return 0.5 if (c == best and k == 0) or k == 2 else 1.0

    class Loaded(FakeMeasure):
        def __call__(self, c, seconds):
            m = super().__call__(c, seconds)
            m.steps = int(m.steps * load(c))
            return m

    result = search([best, second, third], Loaded(), budget_s=30.0, probe_s=0.5, n_rounds=2)
    assert result.best == best
    # Pooling every measurement (the probe included) would have picked the second.
    assert max(result.stats.values(), key=lambda s: s.steps_per_s).candidate == second
    assert [len(s.measurements) for s in result.stats.values()] == [3, 3, 3]


def test_the_measure_runs_the_learner_on_every_batch():
    from rlstruct.envs import GymEnvInf

    batches = []

    def learn(traj):
        batches.append(int(traj.lengths.sum()))
        time.sleep(0.01)  # the learner's time is part of the measured window

    measure = BatcherMeasure(_agent, {}, GymEnvInf, {"env": "CartPole-v1"}, learn=learn)
    m = measure(Candidate(1, 2, 8), 0.05)
    assert m.error is None
    assert batches and all(b == 16 for b in batches)
    # the warm-up batch, then every batch of the window: steps are what the learner got
    assert m.steps == 16 * (len(batches) - 1) and m.wall_s >= 0.01 * (len(batches) - 1)
    with pytest.raises(ConfigError, match="not both"):
        BatcherMeasure(_agent, {}, GymEnvInf, {"env": "CartPole-v1"}, learn=learn, learn_s=0.1)


def test_tune_algo_measures_under_the_learner_with_the_batch_kept(monkeypatch):
    import rlstruct.tools.tune.measure as measure_module
    from rlstruct.envs import GymEnvInf

    seen = {}

    def fake_search(candidates, measure, **kwargs):
        seen.update(candidates=list(candidates), measure=measure, **kwargs)
        return "result"

    monkeypatch.setattr(measure_module, "search", fake_search)

    def learn(traj):
        return None

    setup = AlgoSetup(_agent, {}, GymEnvInf, {"env": "CartPole-v1"}, learn=learn,
                      batch_size=512, pipelined=False)
    # the default keeps the setup's batch
    assert tune_algo(setup, budget_s=5, batch_size=None, processes=(1, 2), verbose=False,
                     devices=()) == "result"
    assert seen["measure"].learn is learn and seen["n_rounds"] == 2
    assert seen["candidates"] and all(
        c.n_processes * c.n_envs * c.n_timesteps == 512 and c.pipeline == 1
        for c in seen["candidates"])
    tune_algo(setup, budget_s=5, keep_batch=False, processes=(1, 2), verbose=False, devices=())
    assert len({c.n_processes * c.n_envs * c.n_timesteps for c in seen["candidates"]}) > 1
    tune_algo(setup, budget_s=5, batch_size=1024, processes=(1, 2), verbose=False, devices=())
    assert {c.n_processes * c.n_envs * c.n_timesteps for c in seen["candidates"]} == {1024}
    tune_algo(setup, budget_s=5, use_learner=False, learn_s=0.01, verbose=False, devices=())
    assert seen["measure"].learn is None and seen["measure"].learn_s == 0.01
    with pytest.raises(ConfigError, match="AlgoSetup"):
        tune_algo("ppo")
    with pytest.raises(ConfigError, match="no batch_size"):
        tune_algo(dataclasses.replace(setup, batch_size=None))


def test_tune_algo_searches_learner_threads_only_under_a_threaded_learner(monkeypatch):
    import rlstruct.tools.tune.measure as measure_module
    from rlstruct.envs import GymEnvInf

    seen = {}
    monkeypatch.setattr(measure_module, "search",
                        lambda candidates, measure, **kw: seen.update(candidates=candidates))
    monkeypatch.setattr(measure_module, "thread_options", lambda: [1, 2, 4])
    setup = AlgoSetup(_agent, {}, GymEnvInf, {"env": "CartPole-v1"}, learn=lambda traj: None,
                      batch_size=512)

    def threads(setup, **kwargs):
        tune_algo(setup, budget_s=5, processes=(1, 2), verbose=False, devices=(), **kwargs)
        return {c.n_threads for c in seen["candidates"]}

    assert threads(setup) == {1, 2, 4}
    assert threads(setup, n_threads_options=(2,)) == {2}
    assert threads(setup, use_learner=False) == {1}
    assert threads(dataclasses.replace(setup, learner_threads=False)) == {1}


@pytest.mark.parametrize("flags, keep, batch_size", [
    ([], True, None),  # the default keeps the algorithm's batch
    (["--keep-batch"], True, None),  # the old flag: the default, accepted
    (["--batch-size", "256"], True, 256),
    (["--vary-batch"], False, None),
])
def test_the_command_line_keeps_the_batch_unless_told_to_vary_it(flags, keep, batch_size,
                                                                 monkeypatch, tmp_path):
    import rlstruct.tools.tune.cli as cli

    seen = {}

    def fake_tune_algo(setup, **kwargs):
        seen.update(kwargs)
        raise ConfigError("stop here")

    monkeypatch.setattr(cli, "load_setup", lambda spec, **overrides: None)
    monkeypatch.setattr(cli, "tune_algo", fake_tune_algo)
    assert main(["--algo", "a:b", "-o", str(tmp_path / "t.json"), *flags]) == 2
    assert seen["keep_batch"] is keep and seen["batch_size"] == batch_size
    assert "n_threads_options" not in seen  # tune_algo's default: 1 up to the cores
    assert main(["--algo", "a:b", "--n-threads", "1,2", *flags]) == 2
    assert seen["n_threads_options"] == [1, 2]


@pytest.mark.parametrize("flags", [["--vary-batch", "--keep-batch"],
                                   ["--vary-batch", "--batch-size", "8"]])
def test_vary_batch_excludes_keeping_it(flags, capsys):
    assert main(["--algo", "a:b", *flags]) == 2
    assert "exclude each other" in capsys.readouterr().err


@pytest.mark.parametrize("spec, match", [
    ("ppo", "MODULE:FUNCTION"),
    ("no_such_module_xyz:ppo", "cannot import"),
    ("rlstruct.algos.tuning:nope", "no function 'nope'"),
    ("rlstruct.tools.tune:candidate_grid", "failed: "),  # does not take the overrides
    ("builtins:dict", "returned dict, expected an AlgoSetup"),
])
def test_the_command_line_names_the_algorithm_side(spec, match, capsys):
    assert main(["--algo", spec, "--budget", "1"]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["ppo", "a2c", "impala"])
def test_the_algorithms_hand_over_a_learn_step_that_trains(name):
    from rlstruct.algos import tuning

    setup = getattr(tuning, name)(hidden=16)
    assert setup.name == name and setup.env_id == "CartPole-v1" and setup.batch_size > 0
    _, trained = learn_on_one_batch(setup, n_timesteps=8)
    assert trained


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_real_tune_under_the_learner_keeps_the_batch(tmp_path, capsys):
    out = tmp_path / "tune.json"
    code = main(["--algo", "rlstruct.algos.tuning:ppo", "--hidden", "16", "--processes", "1",
                 "--n-envs", "8,16", "--devices", "none", "--budget", "8",
                 "--probe-s", "0.2", "-o", str(out)])
    assert code == 0
    assert "the algorithm's learner, batch 512 steps" in capsys.readouterr().out
    tuned = read_layout(out)
    assert tuned.layout.n_envs * tuned.n_timesteps == 512  # PPO's 2 x 8 x 32, kept
    assert tuned.tuned["learner"] == "algorithm" and tuned.tuned["steps_per_s"] > 0
    assert tuned.n_threads >= 1  # the learner's threads were searched, the pick's recorded

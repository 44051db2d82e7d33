"""``--layout auto`` (issue 41, item 1): the layout from the machine, the hyperparameters from the
preset. On the 2-core machine the rule gives back every preset's own measured layout; on any
machine it keeps the envs in all (a hyperparameter) and only moves work: worker processes, envs
per worker, the learner's device and threads. ``config.json`` says where the layout came from.
"""

from __future__ import annotations

import dataclasses

import pytest

from rlstruct.algos import a2c, appo, dqn, impala, ppo, sac
from rlstruct.runs.config import layout_source, session_record
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.machine import Machine, apply_auto_layout, auto_layout
from rlstruct.runs.resolve import resolve

PRESETS = [(ppo, "atari"), (ppo, "atari-fast"), (ppo, "atari-lstm"), (a2c, "atari"), (dqn, "atari"),
           (impala, "atari"), (appo, "atari"), (sac, "mujoco")]
TWO_CORES = Machine(cores=2, gpus=0, envpool=False)


@pytest.mark.parametrize(("module", "preset"), PRESETS,
                         ids=[f"{m.__name__.split('.')[-1]}-{p}" for m, p in PRESETS])
def test_on_two_cores_the_rule_gives_each_preset_its_own_measured_layout(module, preset):
    cfg = module.Config.from_preset(preset)
    choice = auto_layout(cfg.layout, TWO_CORES)
    assert (choice.n_processes, choice.n_envs, choice.n_threads) == (
        cfg.layout.n_processes, cfg.layout.n_envs, cfg.n_threads), choice.reason
    assert choice.learner_device == cfg.layout.learner_device == "auto"


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 6, 8, 12, 16, 64])
@pytest.mark.parametrize("gpus", [0, 1])
@pytest.mark.parametrize(("n_processes", "n_envs", "pipeline"),
                         [(2, 4, 1), (2, 8, 1), (2, 4, 2), (3, 5, 1), (1, 1, 1), (1, 8, 2),
                          (2, 30, 1)])
def test_the_envs_in_all_stay_and_only_the_work_moves(cores, gpus, n_processes, n_envs, pipeline):
    layout = LayoutConfig(n_processes=n_processes, n_envs=n_envs, pipeline=pipeline)
    choice = auto_layout(layout, Machine(cores, gpus, envpool=False))
    assert choice.n_processes * choice.n_envs == n_processes * n_envs, choice.reason
    assert 1 <= choice.n_processes <= max(cores, 1) and choice.n_threads >= 1
    assert choice.learner_device == ("cuda" if gpus else "auto")
    if gpus:  # one thread feeds the GPU; a core is left for it
        assert choice.n_threads == 1
        assert choice.n_processes <= max(1, cores - 1) or (n_processes, pipeline) == (1, 1)
    elif pipeline == 1 and n_processes > 1:  # collect, then learn: each phase takes every core
        assert choice.n_threads == cores
    elif pipeline >= 2:  # at once: the learner takes what the workers leave and one, 2 at least
        assert choice.n_threads == min(cores, max(2, cores - choice.n_processes + 1))


def test_a_learner_pinned_to_the_cpu_stays_there_on_a_gpu_machine():
    layout = LayoutConfig(n_processes=2, n_envs=4, learner_device="cpu")
    choice = auto_layout(layout, Machine(16, 1, envpool=True))
    assert (choice.learner_device, choice.n_threads, choice.n_processes) == ("cpu", 16, 8)
    assert "16 cores, 1 GPUs, envpool installed" in choice.reason


def test_one_worker_per_core_keeps_its_meaning():
    choice = auto_layout(LayoutConfig(n_processes=0, n_envs=3), Machine(6, 0, False))
    assert (choice.n_processes, choice.n_envs) == (0, 3) and "18 envs" in choice.reason


def test_layout_auto_is_applied_by_resolve_and_recorded_with_the_machine():
    cfg = ppo.Config.from_preset("atari", layout_file="auto", env_id="CartPole-v1",
                                 env_backend="gym", model="mlp")
    here = Machine.here()
    resolved = resolve(cfg).cfg
    expected = dataclasses.replace(cfg)
    apply_auto_layout(expected, here)
    assert resolved.layout == expected.layout and resolved.n_threads == expected.n_threads
    assert layout_source(resolved) == "auto"
    record = session_record(resolved, 0, {})
    assert record["layout_source"] == "auto"
    assert record["machine"] == {"cores": here.cores, "gpus": here.gpus, "envpool": here.envpool}
    assert "machine" not in session_record(resolve(ppo.Config()).cfg, 0, {})


def test_the_big_batch_preset_fills_a_16_core_gpu_node_and_2_cores_alike():
    layout = ppo.Config.from_preset("atari-fast").layout
    node = auto_layout(layout, Machine(16, 1, envpool=False))
    assert (node.n_processes, node.n_envs, node.n_threads, node.learner_device) == (
        15, 4, 1, "cuda"), node.reason
    two = auto_layout(layout, TWO_CORES)
    assert (two.n_processes, two.n_envs, two.n_threads) == (2, 30, 2), two.reason


@pytest.mark.parametrize("envpool", [False, True], ids=["without-envpool", "with-envpool"])
def test_an_atari_run_steps_its_envs_with_envpool_where_it_is_installed(envpool):
    for module, preset in PRESETS:
        cfg = module.Config.from_preset(preset)
        choice = auto_layout(cfg.layout, Machine(2, 0, envpool), cfg.env_backend)
        plain = auto_layout(cfg.layout, Machine(2, 0, False), cfg.env_backend)
        expected = "envpool" if envpool and cfg.env_backend == "atari" else cfg.env_backend
        assert choice.env_backend == expected, (preset, choice.reason)
        assert choice.reason.endswith(f"env backend {expected}")
        assert (choice.n_processes, choice.n_envs, choice.n_threads) == (
            plain.n_processes, plain.n_envs, plain.n_threads)  # only the backend moves


def test_apply_auto_layout_sets_the_backend_it_chose():
    cfg = a2c.Config.from_preset("atari")
    apply_auto_layout(cfg, Machine(2, 0, envpool=True))
    assert cfg.env_backend == "envpool"
    cfg = a2c.Config.from_preset("atari")
    apply_auto_layout(cfg, Machine(2, 0, envpool=False))
    assert cfg.env_backend == "atari"
    cfg = sac.Config.from_preset("mujoco")
    apply_auto_layout(cfg, Machine(2, 0, envpool=True))
    assert cfg.env_backend == "gymnasium"

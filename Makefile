# Two-command quickstart: `make demo` and `make test`. Both create/refresh .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: venv demo test test-fast lint docs bench gpu-check gpu-scale clean

# torch is installed only when the venv lacks it: a GPU user keeps their CUDA build, and a
# machine with a local CPU wheel never downloads CUDA packages.
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch
	$(PIP) install -e ".[dev]"
	touch $@

# The documentation site's tools (the docs extra), constrained to the venv's torch so that pip
# never replaces it.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PY) -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' > $(VENV)/torch-constraint.txt
	$(PIP) install -c $(VENV)/torch-constraint.txt -e ".[docs]"
	touch $@

# The documentation as a site (Sphinx, docs/conf.py): the pages of docs/, a page per tutorial and
# the API reference generated from the docstrings, into docs/_build/html; warnings are errors.
docs: $(VENV)/.docs-installed
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

# The main job: PPO on CartPole-v1 with 2 worker processes (the multi-process batcher), until the mean
# return of the last 20 training episodes reaches 475 (or 50 s pass). Outputs go to runs/.
# rlstruct is the console script of the package (the same as python -m rlstruct).
demo: venv
	$(VENV)/bin/rlstruct train ppo --time-budget 50

lint: venv
	$(VENV)/bin/ruff check .

# The suite runs in TEST_WORKERS pytest-xdist processes (3 on the 2-core machine CI runs on: many
# tests wait on subprocesses, clusters and Slurm jobs, so a third worker fills the idle core time;
# the tests that share a cluster or trained runs stay in one worker, tests/conftest.py); the 40
# slowest tests are listed at the end, so CI's log says where the time went.
TEST_WORKERS ?= 3
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

test: venv lint
	$(PYTEST) rlstruct tests --durations=40

# The inner loop: everything but the tests marked slow (worker processes, subprocess runs of the
# algorithms, tutorials, benchmark smokes); about 3 minutes on 2 cores. CI runs `make test`.
test-fast: venv lint
	$(PYTEST) rlstruct tests -m "not slow"

bench: venv
	$(PY) benchmarks/containers.py
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/learning.py
	$(PY) benchmarks/torch_envs.py
	$(PY) benchmarks/ray_backend.py
	$(PY) benchmarks/envpool_atari.py

# Every GPU path in one call (benchmarks/gpu_check.py): the gpu-marked tests, PPO --preset atari with
# the learner on the GPU beside the CPU, torch-native envs at 65k envs, a SerialBatcher on cuda, a
# cuda learner with a CPU batcher; under 8 minutes on one GPU; the report goes to gpu-report.md.
gpu-check: venv
	$(PY) benchmarks/gpu_check.py --out gpu-report.md

# How much of a GPU node rlstruct fills (benchmarks/gpu_scale.py): PPO on Pong and SAC on Hopper at
# --layout auto, torch-native CartPole at 65k envs against the hand loop, each beside the 2-core
# figure; at most 9 minutes; the report goes to gpu-scale.md.
gpu-scale: venv
	$(PY) benchmarks/gpu_scale.py --out gpu-scale.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache docs/_build docs/generated

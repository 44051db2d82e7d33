"""The install recipes as written: the README's extras line, parsed from README.md and run, and
the wheel, which must hold the package and the ``rlstruct`` console script and work from a fresh
environment outside the checkout (``.ci/wheel-check`` does the same in CI, with a fresh torch).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
#: Signs in pip's output that the package index could not be reached.
OFFLINE = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable",
           "Failed to establish a new connection", "ProxyError", "No matching distribution")


def bash_lines(markdown: str) -> list[str]:
    """The lines of the ```bash blocks of a Markdown text."""
    blocks = re.findall(r"^```bash\n(.*?)^```", markdown, re.M | re.S)
    return [line for block in blocks for line in block.splitlines()]


def extras_recipe() -> str:
    """The README's line that installs extras while keeping the installed torch."""
    lines = [line for line in bash_lines(README.read_text()) if line.startswith("pip install -c")]
    assert len(lines) == 1, f"expected one 'pip install -c' line in README.md, got {lines}"
    return lines[0]


def test_the_extras_recipe_is_one_line_that_constrains_torch_to_the_installed_one():
    line = extras_recipe()
    assert not line.rstrip().endswith("\\")  # nothing continues it on the next line
    found = re.search(r"<\(python -c '([^']+)'\)", line)
    assert found, f"no <(python -c '...') constraint in {line!r}"
    assert re.search(r'-e "\.\[[a-z,]+\]"$', line)
    done = subprocess.run([sys.executable, "-c", found.group(1)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    requirement = Requirement(done.stdout.strip())  # a valid constraint ...
    installed = importlib.metadata.version("torch")
    assert requirement.name == "torch" and str(requirement.specifier) == f"=={installed}"
    assert requirement.specifier.contains(installed, prereleases=True)  # ... that holds now


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_extras_recipe_resolves_without_touching_torch():
    if not hasattr(os, "fork"):
        pytest.skip("bash process substitution")
    line = extras_recipe()
    # The line as written, run by this interpreter's pip and python, as a dry run.
    command = line.replace("pip install", f"{shlex.quote(sys.executable)} -m pip install "
                                          "--dry-run --disable-pip-version-check", 1)
    command = command.replace("<(python -c", f"<({shlex.quote(sys.executable)} -c", 1)
    done = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True,
                          timeout=280)
    output = done.stdout + done.stderr
    if done.returncode != 0 and any(sign in output for sign in OFFLINE):
        pytest.skip(f"the package index is unreachable: {output[-300:]}")
    assert done.returncode == 0, output[-3000:]
    would = re.search(r"^Would install (.*)$", done.stdout, re.M)
    assert would and "rlstruct-" in would.group(1), done.stdout[-2000:]
    assert "torch-" not in would.group(1)  # the installed torch satisfies the constraint


def build_wheel(folder: Path) -> Path:
    """Builds rlstruct's wheel into ``folder`` with this environment's setuptools (no index)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(folder), str(REPO)],
        capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = folder.glob("rlstruct-*.whl")
    return wheel


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_wheel_installs_the_command_and_trains_outside_the_checkout(tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names
                            if n.endswith(".dist-info/entry_points.txt"))
    for module in ("rlstruct/__main__.py", "rlstruct/algos/ppo.py", "rlstruct/runs/__init__.py",
                   "rlstruct/runs/run.py", "rlstruct/runs/layout_file.py",
                   "rlstruct/tools/sweep.py", "rlstruct/tools/tune/cli.py"):
        assert module in names, f"{module} is not in {wheel.name}"
    assert re.search(r"^\[console_scripts\]\nrlstruct = rlstruct\.__main__:main$", entry_points,
                     re.M)
    # A fresh venv that sees this one's packages (torch...) through a .pth, below its own
    # site-packages, where the wheel goes; the checkout is on no path.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True)
    (Path(site.stdout.strip()) / "outer.pth").write_text(sysconfig.get_path("purelib") + "\n")
    done = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index",
                           "--disable-pip-version-check", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    script = env_dir / "bin" / "rlstruct"
    where = subprocess.run([str(python), "-c", "import rlstruct; print(rlstruct.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout + where.stderr
    listed = subprocess.run([str(script), "--help"], cwd=work, env=env, capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    for command in ("train", "evaluate", "plot", "sweep", "tune"):
        assert f"• {command} " in listed.stdout
    trained = subprocess.run([str(script), "train", "ppo", "--time-budget", "5", "--n-processes",
                              "1", "--eval-every", "0"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=120)
    assert trained.returncode == 0, trained.stderr[-3000:]
    (run_dir,) = (work / "runs").iterdir()
    assert (run_dir / "summary.json").is_file()


# ------------------------------------------------------------------ install advice
#: The package written as a name an index would serve (``rlstruct[ray]``, ``"rlstruct[ray]"``,
#: ``pip install rlstruct``): rlstruct is on no package index, so pip answers "from versions:
#: none". A clone's path (``-e "$HOME/src/rlstruct[ray]"``) or a wheel's is fine. This file's own
#: examples are left out of the scan.
_NAME = "rl" + "struct"
BARE_ADVICE = re.compile(
    rf"(?<![\w/.$-])[\"']?{_NAME}\[[\w,]*\]"  # the name with extras, no path before it
    rf"|pip3? install\s+[\"']?{_NAME}[\"']?(?=[\s`)'\";]|$)",  # the bare name
    re.M,
)
#: The text files whose words reach a user: pages, help texts, messages, scripts, tests' skips.
ADVICE_SUFFIXES = {".md", ".py", ".toml", ".txt", ".cfg", ".sh", ".rst", ".yml", ".yaml"}


def bare_install_advice(text: str) -> list[str]:
    """The places of ``text`` that tell to install rlstruct from a package index."""
    return [m[0] for m in BARE_ADVICE.finditer(text)]


def test_the_install_advice_check_finds_a_package_index_name():
    text = ("pip install 'rlstruct[ray]'\n(pip install rlstruct[mujoco])\n"
            '    "needs Ray: pip install "\n    "rlstruct[ray]"\npip install rlstruct\n'
            "pip install -e '.[ray]' and pip install -e \"$HOME/src/rlstruct[ray]\" and "
            "pip install 'dist/rlstruct-0.1.0-py3-none-any.whl[ray]' and import rlstruct\n")
    assert bare_install_advice(text) == ["'rlstruct[ray]", "rlstruct[mujoco]", '"rlstruct[ray]',
                                         "pip install rlstruct"]


def test_no_text_tells_to_install_rlstruct_from_a_package_index():
    """README, docs, help texts, error messages, tutorials, benchmarks, tests, Makefile and CI
    scripts say what works: ``pip install -e '.[EXTRA]'`` in a clone, or the wheel's path."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             timeout=60)
    if tracked.returncode != 0:
        pytest.skip(f"not a git checkout: {tracked.stderr.strip()}")
    paths = [REPO / p for p in tracked.stdout.splitlines()]
    paths = [p for p in paths if p.is_file() and p != Path(__file__).resolve() and (
        p.suffix in ADVICE_SUFFIXES or p.name == "Makefile" or ".ci" in p.parts)]
    assert len(paths) > 100
    found = {str(p.relative_to(REPO)): advice for p in paths
             if (advice := bare_install_advice(p.read_text(encoding="utf-8", errors="replace")))}
    assert not found, f"install advice that names rlstruct as an index package: {found}"

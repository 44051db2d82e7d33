"""The documentation stays true: API reference complete and current, links valid, examples run.

- every public name (``__all__`` of the modules ``docs/gen_api.py`` documents: the core, the
  experiment layer the algorithms import, rlstruct.compat) has its entry in docs/api.md, and
  ``docs/gen_api.py --check`` finds nothing to regenerate;
- every relative link of README.md, docs/*.md, rlstruct/algos/README.md and tutorials/ points to an
  existing file INSIDE the repository, and every ``#anchor`` to a heading of the target page;
  no page names a path that leaves the repository (``../shared/...``) or a Markdown file that
  the repository does not hold (notes kept elsewhere, such as a ``STYLE.md``);
- every ``>>>`` example of docs/*.md runs (api.md excepted: its examples are the docstrings',
  which ``pytest --doctest-modules rlstruct`` runs), every other Python block of the written
  pages compiles, and the GPU layout script of guide-gpus.md runs on the CPU;
- the key schema table of concepts.md is the table of rlstruct/keys.py;
- every test the written pages name (coverage tables) is defined under tests/.
"""

from __future__ import annotations

import doctest
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
#: Every page whose links must resolve inside the repository.
LINKED_PAGES = [REPO / "README.md", *PAGES, REPO / "rlstruct" / "algos" / "README.md"]
LINKED_PAGES += sorted(REPO.glob("tutorials/**/*.md"))
LINKED_IDS = [p.relative_to(REPO).as_posix() for p in LINKED_PAGES]
sys.path.insert(0, str(DOCS))
from gen_api import MODULES as DOCUMENTED  # noqa: E402  (the modules api.md documents)

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)


def _without_code(text: str) -> str:
    """The page with fenced blocks removed and inline code replaced (links stay)."""
    text = _FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "code", text)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of ``page`` (duplicates get ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_the_docs_exist():
    names = {p.name for p in PAGES}
    assert {
        "index.md",
        "concepts.md",
        "guide-gpus.md",
        "guide-performance.md",
        "guide-reliability.md",
        "algorithms.md",
        "api.md",
        "migrating-from-rlstructures.md",
    } <= names


@pytest.mark.parametrize("module_name", DOCUMENTED)
def test_every_public_name_is_in_the_api_reference(module_name):
    module = importlib.import_module(module_name)
    headings = set(_HEADING.findall((DOCS / "api.md").read_text()))
    missing = [n for n in module.__all__ if f"{module_name}.{n}" not in headings]
    assert not missing, f"not in docs/api.md: {missing}; run `python docs/gen_api.py`"


@pytest.mark.timeout(120)
def test_api_reference_is_up_to_date():
    done = subprocess.run(
        [sys.executable, str(DOCS / "gen_api.py"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr


@pytest.mark.parametrize("page", LINKED_PAGES, ids=LINKED_IDS)
def test_relative_links_point_to_existing_files(page):
    broken = []
    for target in _LINK.findall(_without_code(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif REPO not in resolved.parents and resolved != REPO:
            broken.append(f"{target}: outside the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with this anchor")
    assert not broken, f"{page.name}: {broken}"


_INLINE_PATH = re.compile(r"`(\.\./[^`\s]+)`")
_MD_NAME = re.compile(r"(?<![\w/.-])([\w.-]+\.md)\b")


@pytest.mark.parametrize("page", LINKED_PAGES, ids=LINKED_IDS)
def test_no_page_points_outside_the_repository(page):
    """Relative paths written as code (``../x``) stay inside the repository, and every Markdown
    file a page names by its bare name is a file of the repository."""
    text = page.read_text()
    outside = [p for p in _INLINE_PATH.findall(text)
               if REPO not in (page.parent / p).resolve().parents]
    held = {p.name for p in REPO.rglob("*.md") if ".venv" not in p.parts}
    unknown = sorted({name for name in _MD_NAME.findall(text) if name not in held})
    assert not outside and not unknown, (
        f"{page.relative_to(REPO)}: paths outside the repository {outside}; Markdown files the "
        f"repository does not hold {unknown}"
    )


DOCTEST_PAGES = [p for p in PAGES if p.name != "api.md" and ">>>" in p.read_text()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page", DOCTEST_PAGES, ids=[p.name for p in DOCTEST_PAGES])
def test_examples_run(page):
    result = doctest.testfile(
        str(page),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        raise_on_error=False,
        verbose=False,
    )
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} failing example(s) in {page.name} (see above)"


def test_concepts_and_index_have_examples():
    assert {p.name for p in DOCTEST_PAGES} >= {"concepts.md", "index.md"}


WRITTEN_PAGES = [p for p in PAGES if p.name != "api.md"]  # api.md's blocks are signatures


@pytest.mark.parametrize("page", WRITTEN_PAGES, ids=[p.name for p in WRITTEN_PAGES])
def test_python_blocks_compile(page):
    for i, (lang, code) in enumerate(_FENCE.findall(page.read_text())):
        if lang == "python" and ">>>" not in code:
            compile(code, f"{page.name}, python block {i}", "exec")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_gpu_layout_script_runs_on_the_cpu(tmp_path):
    text = (DOCS / "guide-gpus.md").read_text()
    marker = text.index("<!-- tests/docs/test_docs.py runs this block")
    code = _FENCE.search(text, marker)[2]
    layout = 'LEARNER, COLLECT, EVAL = "cuda:0", "cuda:1", "cpu"'
    assert layout in code
    script = tmp_path / "layout.py"
    script.write_text(code.replace(layout, 'LEARNER, COLLECT, EVAL = "cpu", "cpu", "cpu"'))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr[-4000:]


def _schema_rows(text: str) -> set[tuple[str, str, str]]:
    rows = set()
    for line in text.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in ("info", "trajectories"):
            rows.add((cells[0], cells[1].strip("`"), cells[2]))
    return rows


def test_concepts_key_schema_is_the_keys_module_table():
    from rlstruct import keys

    section = (DOCS / "concepts.md").read_text().split("## The trajectory key schema")[1]
    documented = _schema_rows(section.split("\n## ")[0])
    expected = _schema_rows(keys.__doc__)
    assert len(expected) == 9
    assert documented == expected


def test_tests_named_in_the_docs_exist():
    """Coverage claims stay honest: every test the written pages name is defined under tests/."""
    tests = REPO / "tests"
    text = "".join(p.read_text() for p in WRITTEN_PAGES)
    for file, name in re.findall(r"tests/(test_\w+)\.py::(test_\w+)", text):
        source = (tests / f"{file}.py").read_text()
        assert re.search(rf"def {name}\(", source), f"tests/{file}.py::{name} does not exist"
    modules = {p.stem for p in tests.glob("test_*.py")}
    defined = set()
    for path in tests.glob("test_*.py"):
        defined |= set(re.findall(r"def (test_\w+)\(", path.read_text()))
    missing = sorted(set(re.findall(r"\b(test_\w+)\b", text)) - defined - modules)
    assert not missing, f"tests named in docs/ but defined nowhere under tests/: {missing}"

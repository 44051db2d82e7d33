"""The documentation stays true: the site builds, links valid, examples run.

- the site (``make docs``: Sphinx, ``docs/conf.py``) builds without a warning (slow), and its API
  reference has a page for every public module (every module of rlstruct with an ``__all__``)
  that documents or links every name of its ``__all__``;
- every relative link of README.md, docs/*.md, rlstruct/algos/README.md and tutorials/ points to
  an existing file INSIDE the repository (or to a page the site generates), every ``#anchor`` of
  a Markdown page to a heading of it, and every ``#Name`` of a module (``../rlstruct/errors.py#
  ShapeError``, an API entry on the site) to a name of that module's ``__all__``; no page names a
  path that leaves the repository (``../shared/...``) or a Markdown file that the repository does
  not hold (notes kept elsewhere, such as a ``STYLE.md``);
- every ``>>>`` example of docs/*.md runs (the docstrings' own run with ``pytest
  --doctest-modules rlstruct``), and every other Python block of the written pages compiles (the
  scripts the guides explain are tutorials, which tests/docs/test_tutorials.py runs);
- the key schema table of concepts.md is the table of rlstruct/keys.py;
- every test the written pages name (coverage tables) is defined under tests/;
- every module path the pages and tutorials write exists: each dotted ``rlstruct.x.y`` is a
  module or an attribute of one (imports of their Python included), each ``rlstruct/x.py``,
  ``benchmarks/x.py``, ``tests/...`` path or folder a file or folder of the repository, unless
  the page cites the commit a removed one is from right behind it (``of commit e9b5192``);
- every tutorial names the one page it is the runnable companion of, and that page links it.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import re
import subprocess
import sys
import textwrap
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
import conf as site  # noqa: E402  (docs/conf.py: the site's API modules and generated pages)

# a fenced block, at the margin or indented in a list item (group 1: the indent)
_FENCE = re.compile(r"^([ \t]*)```(\w*)\n(.*?)^\1```", re.S | re.M)


def code_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block of a page, the body dedented."""
    return [(lang, textwrap.dedent(body)) for _indent, lang, body in _FENCE.findall(text)]

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)


def _module_all(path: Path) -> list[str] | None:
    """The names of the module-level ``__all__`` of a source file, or None when it has none."""
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return list(ast.literal_eval(node.value))
    return None


def _public_modules() -> list[str]:
    """Every module of rlstruct with an ``__all__``, found by parsing (not as conf.py does)."""
    found = []
    for path in (REPO / "rlstruct").rglob("*.py"):
        if _module_all(path) is not None:
            parts = path.relative_to(REPO).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(found)


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
        "migrating-from-rlstructures.md",
    } <= names
    assert (DOCS / "conf.py").is_file()


def test_every_public_module_is_in_the_api_reference():
    """conf.py's list of modules is every module with an ``__all__``, and the API reference's
    root page lists each one (a module left out of either fails here)."""
    expected = _public_modules()
    assert len(expected) > 50
    assert sorted(site.API_MODULES) == expected
    index = site.api_index()
    toctree = index.split(".. toctree::")[1]
    listed = re.findall(r"^   (rlstruct[\w.]*)$", toctree, re.M)
    assert listed == expected
    assert {f"api/{m}.rst" for m in expected} <= set(site.generated_pages())


@pytest.fixture(scope="module")
def api_pages():
    """Every API page as conf.py generates it (optional dependencies mocked as in the build)."""
    pytest.importorskip("sphinx", reason="the site's tools: pip install -e '.[docs]'")
    from sphinx.ext.autodoc.mock import mock

    with mock(site.autodoc_mock_imports):
        return {m: site.api_page(m) for m in site.API_MODULES}


@pytest.mark.parametrize("module_name", _public_modules())
def test_every_public_name_is_in_its_module_page(api_pages, module_name):
    page = api_pages[module_name]
    assert f".. automodule:: {module_name}" in page
    module = importlib.import_module(module_name)
    missing = [n for n in module.__all__ if f":: {module_name}.{n}\n" not in page
               and not re.search(rf"- :py:\w+:`{n} <", page)]
    assert not missing, f"not documented nor linked on the API page of {module_name}: {missing}"


def _top_level_imports(path: Path) -> set[str]:
    """The packages a module's source imports at its top level (inside ``try``/``if`` too, not
    inside functions)."""
    found: set[str] = set()
    body = list(ast.parse(path.read_text()).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, (ast.Try, ast.If)):
            body += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            body += [s for h in getattr(node, "handlers", []) for s in h.body]
    return found


def test_without_the_optional_dependencies_no_public_name_is_a_mock():
    """``make docs`` without Ray: conf.py mocks the optional dependencies that are missing, and
    autodoc turns a public name bound to a mock ("A mocked object is detected") into an error
    under -W. Each module that imports an optional dependency at its top level is imported
    afresh with that dependency mocked (as in a venv without it), and none of its ``__all__``
    may be a mock."""
    pytest.importorskip("sphinx", reason="the site's tools: pip install -e '.[docs]'")
    from sphinx.ext.autodoc.mock import ismock, mock

    optional = set(site.OPTIONAL_IMPORTS)
    importers = {m: _top_level_imports(_module_file(m.split("."))) & optional
                 for m in site.API_MODULES}
    importers = {m: deps for m, deps in importers.items() if deps}
    assert "rlstruct.parallel.ray_cluster" in importers  # the check sees the Ray module
    deps = sorted(set().union(*importers.values()))
    hidden = [k for k in sys.modules if k.split(".")[0] in deps or k in importers]
    saved = {k: sys.modules.pop(k) for k in hidden}
    mocked = []
    try:
        with mock(deps):
            for name in importers:
                module = importlib.import_module(name)
                mocked += [f"{name}.{n}" for n in module.__all__ if ismock(getattr(module, n))]
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] in deps or k in importers]:
            del sys.modules[k]
        sys.modules.update(saved)
        for name in importers:  # the parent package's attribute: the module it had
            parent, _, child = name.rpartition(".")
            if name in saved and parent in sys.modules:
                setattr(sys.modules[parent], child, saved[name])
    assert not mocked, f"public names that are a mock without their optional dependency: {mocked}"


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_site_builds_without_a_warning(tmp_path):
    for name in ("sphinx", "myst_parser", "furo"):
        pytest.importorskip(name, reason="the site's tools: pip install -e '.[docs]'")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
        cwd=REPO, capture_output=True, text=True, timeout=400,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    html = tmp_path / "html"
    assert (html / "generated" / "api" / "rlstruct.errors.html").is_file()
    assert (html / "generated" / "tutorials" / "01_dicttensor.html").is_file()
    # a link written for GitHub as ../rlstruct/errors.py#ShapeError lands on the API entry
    reliability = (html / "guide-reliability.html").read_text()
    assert "generated/api/rlstruct.errors.html#rlstruct.errors.ShapeError" in reliability


def _link_problem(page: Path, target: str) -> str | None:
    """What is wrong with the relative link ``target`` of ``page``, or None."""
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    generated = site.GENERATED
    if resolved == generated or generated in resolved.parents:
        rel = resolved.relative_to(generated).as_posix()
        return None if rel in site.generated_pages() else "not a page the site generates"
    if not resolved.exists():
        return "no such file"
    if REPO not in resolved.parents and resolved != REPO:
        return "outside the repository"
    if anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
        return "no heading with this anchor"
    if anchor and resolved.suffix == ".py":
        names = _module_all(resolved)
        if names is None or anchor not in names:
            return f"{anchor} is not a name of the module's __all__ (no API entry)"
    return None


@pytest.mark.parametrize("page", LINKED_PAGES, ids=LINKED_IDS)
def test_relative_links_point_to_existing_files(page):
    broken = []
    for target in _LINK.findall(_without_code(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        problem = _link_problem(page, target)
        if problem:
            broken.append(f"{target}: {problem}")
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


#: A Markdown file named by a path (``docs/guide-x.md``, ``../docs/x.md``) in prose, code or a
#: message; not inside a URL (no ``/`` or word character right before it).
_MD_PATH = re.compile(r"(?<![\w/.:-])((?:\.\.?/)*(?:[\w.-]+/)+[\w.-]+\.md)\b")
#: Every text that names pages by their paths: the pages, and the code's docstrings and messages.
MD_PATH_SOURCES = [*LINKED_PAGES, *sorted(p for folder in ("rlstruct", "benchmarks", "tutorials",
                                                             "examples")
                                          for p in (REPO / folder).rglob("*.py")),
                   REPO / "Makefile"]


def missing_md_paths(source: Path) -> list[str]:
    """The Markdown paths ``source`` writes (in prose, inline code, links or code) that are no
    file: each is read from the source's folder and from the repository's root (a message says
    ``docs/guide-clusters.md`` from the root)."""
    found = _MD_PATH.findall(source.read_text(encoding="utf-8"))
    return sorted({p for p in found if not (source.parent / p).is_file()
                   and not (REPO / p).is_file()})


def test_the_markdown_path_check_finds_a_missing_page(tmp_path):
    source = tmp_path / "page.md"
    source.write_text("such a node (docs/guide-tuning.md); see `../docs/nothing.md`, "
                      "docs/guide-resources.md, https://github.com/a/b/blob/main/docs/x.md\n")
    assert missing_md_paths(source) == ["../docs/nothing.md", "docs/guide-tuning.md"]


def test_every_markdown_path_written_names_a_file():
    """A page path written outside a link (``docs/guide-tuning.md`` in prose, a message or a
    docstring) is a file of the repository; links are checked above."""
    assert len(MD_PATH_SOURCES) > 100
    missing = {str(p.relative_to(REPO)): m for p in MD_PATH_SOURCES if (m := missing_md_paths(p))}
    assert not missing, f"Markdown files named that do not exist: {missing}"


DOCTEST_PAGES = [p for p in PAGES if ">>>" in p.read_text()]


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


WRITTEN_PAGES = PAGES


@pytest.mark.parametrize("page", WRITTEN_PAGES, ids=[p.name for p in WRITTEN_PAGES])
def test_python_blocks_compile(page):
    for i, (lang, code) in enumerate(code_blocks(page.read_text())):
        if lang == "python" and ">>>" not in code:
            compile(code, f"{page.name}, python block {i}", "exec")


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
    """Coverage claims stay honest: every test the written pages name is defined under tests/
    (in its group's folder: ``tests/runs/test_run.py::test_...``)."""
    tests = REPO / "tests"
    text = "".join(p.read_text() for p in WRITTEN_PAGES)
    for file, name in re.findall(r"tests/((?:\w+/)*test_\w+)\.py::(test_\w+)", text):
        path = tests / f"{file}.py"
        assert path.is_file(), f"tests/{file}.py does not exist"
        assert re.search(rf"def {name}\(", path.read_text()), f"no test {name} in tests/{file}.py"
    for file in re.findall(r"tests/((?:\w+/)*test_\w+)\.py", text):
        assert (tests / f"{file}.py").is_file(), f"tests/{file}.py does not exist"
    files = [p for p in tests.rglob("test_*.py") if "support" not in p.parts]
    modules = {p.stem for p in files}
    defined = set()
    for path in files:
        defined |= set(re.findall(r"def (test_\w+)\(", path.read_text()))
    missing = sorted(set(re.findall(r"\b(test_\w+)\b", text)) - defined - modules)
    assert not missing, f"tests named in docs/ but defined nowhere under tests/: {missing}"


def test_every_algorithm_is_in_the_algorithm_tables():
    """Issue 27: the docs said "five algorithms" and left APPO out of both tables."""
    algos = sorted(p.stem for p in (REPO / "rlstruct" / "algos").glob("*.py")
                   if p.stem not in ("__init__", "tuning", "presets"))
    assert len(algos) == 8
    readme = (REPO / "rlstruct" / "algos" / "README.md").read_text()
    guide = (DOCS / "algorithms.md").read_text().split("## The algorithms")[1]
    for name in algos:
        assert f"| `{name}.py` |" in readme, f"rlstruct/algos/README.md has no row for {name}"
        assert f"`rlstruct.algos.{name}`" in guide, f"docs/algorithms.md has no row for {name}"
    assert "all five" not in readme and "all eight" in readme


_TRAIN = re.compile(r"(?:\brlstruct train |-m rlstruct\.algos\.)(\w+)(.*)")


#: an inline ``rlstruct train ...`` span of the prose or a table (wrapped lines joined first)
_INLINE_TRAIN = re.compile(r"`(rlstruct train \w+(?: [^`]*)?)`")
#: a placeholder value written in place of a real one (``--seed S``, ``--env-id ENV``)
_PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*|[a-z]")


def doc_train_commands() -> list[tuple[str, str, str]]:
    """``(page, algorithm, flags)`` of every ``rlstruct train ALGO ...`` and ``-m
    rlstruct.algos.ALGO ...`` line of the pages' code blocks, as written (continuation lines
    joined, trailing comments dropped), and of every inline ``rlstruct train ...`` span (the
    commands beside the rows of docs/results.md, say)."""
    found = []
    pages = [p for p in LINKED_PAGES if p.suffix == ".md"]
    for page in pages:
        text = page.read_text()
        lines = [line for _lang, body in code_blocks(text)
                 for line in body.replace("\\\n", " ").splitlines()]
        lines += _INLINE_TRAIN.findall(" ".join(_FENCE.sub("", text).split()))
        for line in lines:
            match = _TRAIN.search(line)
            if match:
                flags = re.split(r"\s#", match.group(2))[0]
                found.append((page.relative_to(REPO).as_posix(), match.group(1), flags))
    return found


def test_the_train_commands_of_the_docs_parse_as_written(capsys):
    """Every training command line the docs show names an algorithm and flags that exist, with
    values of the right types and a preset the algorithm has (parsed by the algorithm's own
    command line, ``command_line_config``: the tyro step, nothing resolved or run). Shell
    variables (``"$RUNS"``, ``$((CPUS - 1))``) and placeholder values (``--seed S``) are left
    out with their flag, and a trailing ``&``; lines with placeholders (``<...>``, an algorithm
    ``ALGO``) are skipped."""
    import shlex

    from rlstruct.__main__ import ALGOS
    from rlstruct.runs.presets import command_line_config

    checked = []
    for page, algo, flags in doc_train_commands():
        if "<" in flags or "..." in flags or not algo.islower():
            continue
        assert algo in ALGOS, f"{page}: no algorithm {algo!r} ({' '.join(ALGOS)})"
        tokens: list[str] = []
        flags = re.sub(r"\$\(\(.*?\)\)", "$N", flags)  # shell arithmetic: one variable
        flags = re.sub(r"\s&\s*$", "", flags)  # started in the background
        for token in shlex.split(flags):
            if "$" in token or _PLACEHOLDER.fullmatch(token):  # a shell variable or a
                # placeholder: drop it and the flag it is the value of
                if tokens and tokens[-1].startswith("--"):
                    tokens.pop()
                continue
            tokens.append(token)
        module = importlib.import_module(f"rlstruct.algos.{algo}")
        try:
            command_line_config(module.Config, tokens, prog=f"rlstruct train {algo}")
        except SystemExit as exit_:
            assert exit_.code == 0, (f"{page}: `rlstruct train {algo}{flags}` does not parse: "
                                     f"{capsys.readouterr().err[-500:]}")
        checked.append((page, algo))
    capsys.readouterr()
    assert len(checked) >= 15, checked  # the extraction finds the docs' commands
    assert {algo for _, algo in checked} >= {"ppo", "dqn", "impala"}
    assert sum("--preset" in flags for _, _, flags in doc_train_commands()) >= 5


_INLINE_TUNE = re.compile(r"`(rlstruct tune [^`]*)`")


def test_the_tune_commands_of_the_docs_set_up_as_written(capsys):
    """Every ``rlstruct tune ...`` line of the pages' code blocks and inline spans parses as
    written (tyro, ``TuneCommand``), and its ``--algo`` function builds the setup the tuner
    would measure, from the command's own keywords (``setup_overrides``): the preset, the env
    backend and the env resolved as a run resolves them; nothing is measured. A command whose
    backend's extra is not installed is parsed only."""
    import importlib.util
    import shlex

    import tyro

    from rlstruct.tools.tune.cli import TuneCommand, load_setup, setup_overrides

    extras = {"envpool": "envpool", "atari": "ale_py"}
    checked, built = [], []
    for page in (p for p in LINKED_PAGES if p.suffix == ".md"):
        text = page.read_text()
        lines = [line for lang, body in code_blocks(text) if lang != "text"  # not output
                 for line in body.replace("\\\n", " ").splitlines()]
        lines += _INLINE_TUNE.findall(" ".join(_FENCE.sub("", text).split()))
        for line in lines:
            found = re.search(r"\brlstruct tune (.*)", line)
            if not found or "<" in found.group(1) or "..." in found.group(1):
                continue
            words: list[str] = []
            for word in shlex.split(re.split(r"\s#", found.group(1))[0].rstrip("`")):
                if _PLACEHOLDER.fullmatch(word) and words and words[-1].startswith("--"):
                    words.pop()  # a placeholder value (--env-backend B): drop it and its flag
                    continue
                words.append(word)
            try:
                args = tyro.cli(TuneCommand, args=words, prog="rlstruct tune")
            except SystemExit as exit_:
                raise AssertionError(f"{page.name}: `rlstruct tune {found.group(1)}` does not "
                                     f"parse: {capsys.readouterr().err[-500:]}") from exit_
            checked.append((page.name, args.algo))
            overrides = setup_overrides(args)
            backend = overrides.get("env_backend") or ("atari" if args.preset else "")
            if backend in extras and importlib.util.find_spec(extras[backend]) is None:
                continue
            setup = load_setup(args.algo, **overrides)
            assert setup.batch_size and setup.env_id, (page.name, words)
            built.append((page.name, setup.name, overrides.get("env_backend")))
    capsys.readouterr()
    assert len(checked) >= 4, checked  # the extraction finds the docs' commands
    assert any(page == "guide-resources.md" for page, _ in checked)
    assert built, checked


def test_the_sweep_commands_of_the_docs_parse_as_written(capsys):
    """Every ``rlstruct sweep ALGO ...`` line of the pages' code blocks parses as written: the
    sweep's own flags (tyro, ``SweepCommand``) and the algorithm's flags after ``--``
    (``command_line_config``); nothing is run. Lines with placeholders are skipped."""
    import shlex

    import tyro

    from rlstruct.runs.presets import command_line_config
    from rlstruct.tools.sweep import SweepCommand

    checked = []
    for page in (p for p in LINKED_PAGES if p.suffix == ".md"):
        for _lang, body in code_blocks(page.read_text()):
            for line in body.replace("\\\n", " ").splitlines():
                found = re.search(r"\brlstruct sweep (.*)", line)
                if not found or "<" in found.group(1) or "$" in found.group(1):
                    continue
                words = shlex.split(re.split(r"\s#", found.group(1))[0])
                cut = words.index("--") if "--" in words else len(words)
                where = f"{page.relative_to(REPO)}: `{line.strip()}`"
                try:
                    args = tyro.cli(SweepCommand, args=words[:cut], prog="rlstruct sweep")
                    module = importlib.import_module(f"rlstruct.algos.{args.algo}")
                    command_line_config(module.Config, words[cut + 1:], prog=args.algo)
                except SystemExit as exit_:
                    assert exit_.code == 0, f"{where} does not parse: {capsys.readouterr().err}"
                checked.append(where)
    capsys.readouterr()
    assert len(checked) >= 5, checked  # the extraction finds the docs' sweeps
    assert sum("--search optuna" in c for c in checked) >= 3, checked


# ------------------------------------------------------------------ the module paths the docs write
#: After a reference to something removed: the commit it was removed after (``of commit c33506d``,
#: ``at commit e9b5192``). A page may name a removed script or module only with such a citation.
CITES_COMMIT = re.compile(r"\W*(?:(?:of|at|after)\s+)?commit\s+[0-9a-f]{7}")
#: Pages whose module paths are checked: the written pages and the tutorials (prose and code).
PATH_PAGES = [*LINKED_PAGES, *sorted(REPO.glob("tutorials/[0-9][0-9]_*.py"))]
PATH_IDS = [p.relative_to(REPO).as_posix() for p in PATH_PAGES]
#: Placeholders the pages write in a dotted path (``python -m rlstruct.algos.ALGO``).
PLACEHOLDERS = {"ALGO", "NAME"}
#: Optional extras: a module that imports one of them is checked by its source when it is absent.
EXTRAS = {"ray", "ale_py", "envpool", "mujoco"}

_DOTTED = re.compile(r"(?<![\w./-])rlstruct(?:\.\w+)+")
_PACKAGES = "batchers|blocks|envs|learners|parallel|runs|tools|algos"
_FILE = re.compile(rf"(?<![\w./-])(?:\.\./)*((?:rlstruct|benchmarks|tutorials|tests|examples"
                   rf"|{_PACKAGES})/[\w./-]*?(?:\.py|/))(?![\w-])")


def _module_file(parts: list[str]) -> Path | None:
    """The source file of the module ``parts`` (``["rlstruct", "runs", "run"]``), or None."""
    base = REPO.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _defined_names(path: Path) -> set[str]:
    """The names a module's source defines or imports at its top level (and ``__all__``)."""
    names = set(_module_all(path) or ())
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def dotted_problem(dotted: str) -> str | None:
    """What is wrong with ``rlstruct.x.y`` (a module, or an attribute of one), or None. The
    module is the longest prefix with a source file; the rest are attributes of it, read after
    importing it, or, when its import needs an optional extra that is not installed, from its
    source (the first attribute only); a lazy name whose import needs a missing extra (the
    package's ``__getattr__`` says so with an ImportError naming it) exists."""
    parts = dotted.rstrip(".").split(".")
    if PLACEHOLDERS & set(parts):
        return None
    n = max(i for i in range(1, len(parts) + 1) if _module_file(parts[:i]) or i == 1)
    module_file = _module_file(parts[:n])
    if module_file is None:
        return "no such module"
    attributes = parts[n:]
    if not attributes:
        return None
    try:
        obj = importlib.import_module(".".join(parts[:n]))
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in EXTRAS:
            raise
        found = attributes[0] in _defined_names(module_file)
        return None if found else f"{'.'.join(parts[:n])} defines no {attributes[0]}"
    for i, name in enumerate(attributes):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            return f"{'.'.join(parts[:n + i])} has no attribute {name}"
        except ImportError as err:  # a lazy name that needs a missing extra (RayBatcher)
            if (err.name or "").split(".")[0] not in EXTRAS:
                raise
            return None  # the package serves the name; what lies past it needs the extra
    return None


def _python_imports(page: Path) -> list[str]:
    """``rlstruct.x.name`` for every ``from rlstruct.x import name`` (and ``import rlstruct.x``)
    of the page's Python: its python blocks (``>>>`` prompts removed), or a tutorial's code."""
    if page.suffix == ".py":
        sources = [page.read_text()]
    else:
        sources = [re.sub(r"^(?:>>>|\.\.\.) ?", "", body, flags=re.M)
                   for lang, body in code_blocks(page.read_text()) if lang == "python"]
    found = []
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a doctest's output lines; the compile test covers the rest
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlstruct"):
                found += [f"{node.module}.{a.name}" for a in node.names if a.name != "*"]
            elif isinstance(node, ast.Import):
                found += [a.name for a in node.names if a.name.startswith("rlstruct.")]
    return found


def cites_commit(text: str, end: int) -> bool:
    """A commit is cited right behind ``text[:end]``, or behind the inline code span it ends
    in (``python benchmarks/x.py [--flag]` of commit c33506d``)."""
    if CITES_COMMIT.match(text, end):
        return True
    span_end = re.compile(r"[^`]*`").match(text, end)
    return bool(span_end) and bool(CITES_COMMIT.match(text, span_end.end()))


def module_path_problems(page: Path) -> list[str]:
    """Every ``rlstruct.x.y`` and every ``rlstruct/...py`` (``benchmarks/``, ``tutorials/``,
    ``tests/``, a package's ``runs/x.py`` under rlstruct/, a folder ``x/``) that ``page``
    writes, in prose, inline code, links or code, and that does not exist, unless the page
    cites the commit it was removed after right behind it."""
    text = page.read_text()
    problems = []
    for match in _DOTTED.finditer(text):
        problem = dotted_problem(match[0])
        if problem and not cites_commit(text, match.end()):
            problems.append(f"{match[0]}: {problem}")
    for dotted in _python_imports(page):
        problem = dotted_problem(dotted)
        if problem:
            problems.append(f"{dotted} (imported): {problem}")
    for match in _FILE.finditer(text):
        path = match[1]
        if (REPO / path).exists() or (REPO / "rlstruct" / path).exists():
            continue
        if path.startswith(("runs/", "tests/")) and not path.endswith(".py"):
            continue  # a run folder (runs/ppo_CartPole-v1_<time>/), a tmp path of a test
        if not cites_commit(text, match.end()):
            problems.append(f"{path}: no such file or folder")
    return problems


def test_the_module_path_check_finds_what_does_not_exist(tmp_path):
    """The check below can fail: wrong names fail, real and cited ones pass."""
    page = tmp_path / "page.md"
    page.write_text(
        "`rlstruct.learn.optim` and `rlstruct.runs.run.Runn`, [x](rlstruct/tools/policy.py),\n"
        "`rlstruct/runs/nothing.py`, `batchers/multiprocess.py`, `rlstruct/nowhere/`.\n"
        "```python\nfrom rlstruct.tools.tune import write_layout\n```\n"
        "Fine: `rlstruct.runs.run.Run.publish`, `rlstruct.blocks.optim.adam`, `runs/run.py`,\n"
        "`rlstruct/envs/torch/`, `rlstruct.load_policy`, `rlstruct/learn/optim.py` of commit\n"
        "e9b5192, `python -m rlstruct.algos.ALGO`, `runs/ppo_CartPole-v1_<time>/`.\n"
        "```python\n>>> from rlstruct.blocks.functional import discounted_returns\n```\n")
    problems = module_path_problems(page)
    assert [p.split(":")[0] for p in problems] == [
        "rlstruct.learn.optim", "rlstruct.runs.run.Runn", "rlstruct.tools.tune.write_layout "
        "(imported)", "rlstruct/tools/policy.py", "rlstruct/runs/nothing.py",
        "batchers/multiprocess.py", "rlstruct/nowhere/"], problems
    assert "has no attribute learn" in problems[0] and "has no attribute Runn" in problems[1]


@pytest.mark.parametrize("page", PATH_PAGES, ids=PATH_IDS)
def test_every_module_path_the_docs_write_exists(page):
    problems = module_path_problems(page)
    assert not problems, (f"{page.relative_to(REPO)} names modules, attributes or files that do "
                          f"not exist (cite the commit a removed one is from): {problems}")


TUTORIALS = sorted(REPO.glob("tutorials/[0-9][0-9]_*.py"))
_COMPANION = re.compile(r"The runnable companion of one page, which explains it and links here:"
                        r"\s*\[[^\]]+\]\(\.\./docs/([\w-]+\.md)(#[\w-]+)?\)")


@pytest.mark.parametrize("tutorial", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_every_tutorial_is_the_companion_of_a_page_that_links_it(tutorial):
    """A tutorial's docstring names the page it accompanies (the page explains, the tutorial
    runs), the anchor is a heading of that page, and the page links the tutorial."""
    doc = ast.get_docstring(ast.parse(tutorial.read_text())) or ""
    found = _COMPANION.search(doc)
    assert found, f"{tutorial.name}: its docstring names no page it is the companion of"
    page = DOCS / found[1]
    assert page.is_file(), f"{tutorial.name}: no page docs/{found[1]}"
    if found[2]:
        assert found[2][1:] in _anchors(page), f"{tutorial.name}: {page.name} has no {found[2]}"
    links = [t.partition("#")[0] for t in _LINK.findall(_without_code(page.read_text()))]
    assert f"../tutorials/{tutorial.name}" in links, f"{page.name} does not link {tutorial.name}"

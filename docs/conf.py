"""Sphinx configuration of the rlstruct documentation site (``make docs``).

The written pages are the Markdown files of this folder (myst-parser). Everything else is made at
build time into ``docs/generated/`` (git-ignored, never committed):

- ``generated/api/``: one page per public module of rlstruct (every module with an ``__all__``,
  subpackages included, listed by :func:`public_modules`), documented from its docstrings by
  autodoc with napoleon (Google style). A name a package re-exports is documented once, in its
  defining module, and the package's page links to it.
- ``generated/tutorials/``: one page per numbered tutorial: its narrative docstring, then its
  code (``literalinclude``).
- ``generated/algos.md``: ``rlstruct/algos/README.md``.

Links between pages are written as on GitHub (relative paths to the files of the repository);
:func:`site_links` rewrites those that leave ``docs/`` to the page that holds the target: a
tutorial to its page, ``rlstruct/algos/README.md`` to the algorithms page, and
``../rlstruct/<module>.py#Name`` to the API entry of ``rlstruct.<module>.Name``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
GENERATED = DOCS / "generated"
sys.path.insert(0, str(REPO))

project = "rlstruct"
author = "rlstruct contributors"
copyright = "rlstruct contributors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
html_theme = "furo"
html_title = "rlstruct"
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_class_signature = "separated"
autodoc_default_options = {"show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
# A method without a docstring of its own shows none (not gymnasium's or torch's, whose markup is
# not ours); the base class's page has the inherited one.
autodoc_inherit_docstrings = False

#: Optional dependencies the build must not need: mocked when they are not installed.
OPTIONAL_IMPORTS = ["ray", "envpool", "ale_py", "mujoco", "pynvml", "matplotlib", "moviepy",
                    "cv2", "pygame"]


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


autodoc_mock_imports = [m for m in OPTIONAL_IMPORTS if not _installed(m)]

_ALL = re.compile(r"^__all__\s*(?::[^=\n]*)?=", re.M)


def public_modules() -> list[str]:
    """Every module of rlstruct that has an ``__all__`` (subpackages included), sorted."""
    names = []
    for path in sorted((REPO / "rlstruct").rglob("*.py")):
        if _ALL.search(path.read_text(encoding="utf-8")):
            parts = path.relative_to(REPO).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


#: The modules the API reference documents, one page each.
API_MODULES = public_modules()


# ----------------------------------------------------------------------------------------------
# Links: written for GitHub, rewritten for the site.

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_LINK = re.compile(r"(?<!!)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")
_TUTORIAL = re.compile(r"\d\d_\w+\.py")


def _module_of(path: Path) -> str | None:
    """The API module a source file of rlstruct is, or None."""
    try:
        parts = path.relative_to(REPO).with_suffix("").parts
    except ValueError:
        return None
    if path.suffix != ".py" or parts[0] != "rlstruct":
        return None
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return name if name in API_MODULES else None


def site_target(target: Path, anchor: str) -> str | Path | None:
    """Where a link to ``target`` (an absolute path in the repository) goes on the site: a page
    (a Path), a reference name (``#rlstruct.x.Name``, a str), or None (no page: plain text)."""
    if target.suffix == ".md" and target.parent == DOCS:
        return target
    if target in (REPO / "rlstruct" / "algos", REPO / "rlstruct" / "algos" / "README.md"):
        return GENERATED / "algos.md"
    if target == REPO / "tutorials":
        return GENERATED / "tutorials" / "index.md"
    if target.parent == REPO / "tutorials" and _TUTORIAL.fullmatch(target.name):
        return GENERATED / "tutorials" / f"{target.stem}.md"
    module = _module_of(target)
    if module:
        return f"#{module}.{anchor}" if anchor else f"#{module}"
    if target.is_file():
        return target  # a file without a page: the site serves it as a download
    return None


def site_links(text: str, source: Path, page: Path) -> str:
    """``text`` (Markdown written at ``source``) with its links rewritten for the site page
    ``page``: a link that leaves ``docs/`` goes to the page holding its target (see
    :func:`site_target`); a link to a folder without a page becomes its text."""

    def rewrite(match: re.Match) -> str:
        label, href = match.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:", href) or href.startswith("#"):
            return match[0]
        path, _, anchor = href.partition("#")
        target = (source.parent / path).resolve()
        if target.parent == DOCS and source.parent == page.parent:
            return match[0]
        new = site_target(target, anchor)
        if new is None:
            return label
        if isinstance(new, str):
            return f"[{label}]({new})"
        rel = Path(os.path.relpath(new, page.parent)).as_posix()
        keep = f"#{anchor}" if anchor and new.suffix == ".md" else ""
        return f"[{label}]({rel}{keep})"

    out, last = [], 0
    for fence in _FENCE.finditer(text):
        out.append(_LINK.sub(rewrite, text[last : fence.start()]))
        out.append(fence[0])
        last = fence.end()
    out.append(_LINK.sub(rewrite, text[last:]))
    return "".join(out)


_TABLE_ROW = re.compile(r"^(\s*)\|(.*)\|\s*$")
_TABLE_RULE = re.compile(r"^\s*\|[\s:|-]+\|\s*$")


def pipe_tables_to_grid(lines: list[str]) -> list[str]:
    """Docstrings draw their tables as Markdown pipe tables (readable in ``help()``); reST needs
    grid tables. Every block of ``| a | b |`` lines whose second line is a ``|---|`` rule
    becomes the grid table of the same cells."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        j = i
        while j < len(lines) and _TABLE_ROW.match(lines[j]):
            j += 1
        if j - i >= 3 and _TABLE_RULE.match(lines[i + 1]):
            indent = _TABLE_ROW.match(lines[i])[1]
            rows = [[c.strip() for c in _TABLE_ROW.match(line)[2].split("|")]
                    for k, line in enumerate(lines[i:j]) if k != 1]
            widths = [max(len(r[c]) if c < len(r) else 0 for r in rows)
                      for c in range(max(map(len, rows)))]

            def rule(char: str, widths: list[int] = widths, indent: str = indent) -> str:
                return indent + "+" + "+".join(char * (w + 2) for w in widths) + "+"

            def row(cells: list[str], widths: list[int] = widths, indent: str = indent) -> str:
                cells = cells + [""] * (len(widths) - len(cells))
                inner = "|".join(f" {c:<{w}} " for c, w in zip(cells, widths))
                return f"{indent}|{inner}|"

            if out and out[-1].strip():
                out.append("")
            out += [rule("-"), row(rows[0]), rule("=")]
            for cells in rows[1:]:
                out += [row(cells), rule("-")]
            if j < len(lines) and lines[j].strip():
                out.append("")
            i = j
        else:
            out.append(lines[i])
            i += 1
    return out


_FIELD_DOCS: dict[str, list[str]] = {}


def _process_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    """Before napoleon: pipe tables to grid tables; keep a field's docstring as it is."""
    lines[:] = pipe_tables_to_grid(lines)
    if what in ("attribute", "data", "property"):
        _FIELD_DOCS[name] = list(lines)


def _restore_field_doc(app, what, name, obj, options, lines: list[str]) -> None:
    """After napoleon: napoleon reads a field's "device of the learner (auto: cuda:0 ...)" as
    "type: description"; a field's docstring here is its help text (tyro shows it), and its type
    is its annotation, so the field keeps its docstring unparsed."""
    if what in ("attribute", "data", "property") and name in _FIELD_DOCS:
        lines[:] = _FIELD_DOCS.pop(name)


def _source_read(app, docname: str, content: list[str]) -> None:
    """Rewrite the links of the written pages (docs/*.md) for the site."""
    path = DOCS / f"{docname}.md"
    if path.parent == DOCS and path.exists():
        content[0] = site_links(content[0], path, path)


# ----------------------------------------------------------------------------------------------
# Generated pages.


def _write(path: Path, text: str) -> None:
    """Write only when the text changed, so that an incremental build rereads nothing else."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def _literal_all(module: str) -> list[str]:
    """The names of a module's ``__all__``, read from its source (no import)."""
    rel = Path(*module.split("."))
    path = REPO / rel / "__init__.py"
    path = path if path.exists() else REPO / rel.with_suffix(".py")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return list(ast.literal_eval(node.value))
    return []


def _directive(module: str, name: str, obj: object) -> str:
    full = f"{module}.{name}"
    if inspect.isclass(obj):
        kind = "autoexception" if issubclass(obj, BaseException) else "autoclass"
        return f".. {kind}:: {full}\n   :members:\n"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return f".. autofunction:: {full}\n"
    return f".. autodata:: {full}\n"


def api_page(module: str) -> str:
    """The reST page of one public module: its docstring, the names it defines, and links to
    the names it re-exports from another public module (documented there)."""
    mod = importlib.import_module(module)
    own, reexported = [], []
    for name in mod.__all__:
        obj = getattr(mod, name)
        if inspect.ismodule(obj):
            home, home_name = obj.__name__, None
        else:
            home, home_name = getattr(obj, "__module__", None), name
        if home != module and home in API_MODULES and (home_name is None or (
                home_name in _literal_all(home) and getattr(sys.modules[home], name) is obj)):
            target = home if home_name is None else f"{home}.{name}"
            role = "mod" if home_name is None else "obj"
            reexported.append(f"- :py:{role}:`{name} <{target}>`")
        else:
            own.append(_directive(module, name, obj))
    title = f"``{module}``"
    parts = [f"{title}\n{'=' * len(title)}\n", f".. automodule:: {module}\n   :no-members:\n"]
    if reexported:
        parts.append(".. rubric:: Re-exported here, documented where they are defined\n")
        parts.append("\n".join(reexported) + "\n")
    parts.extend(own)
    return "\n".join(parts)


def api_index() -> str:
    """The API reference's root page: a toctree of :data:`API_MODULES`."""
    entries = "\n".join(f"   {m}" for m in API_MODULES)
    return (
        "API reference\n=============\n\n"
        "Generated from the docstrings at build time: one page per public module of rlstruct "
        "(every module with an ``__all__``). A name that a package re-exports (``rlstruct."
        "Batcher``) is documented once, in the module that defines it, and the package's page "
        "links to it.\n\n"
        f".. toctree::\n   :maxdepth: 1\n\n{entries}\n"
    )


def tutorial_page(path: Path) -> str:
    """A tutorial's page: its docstring as the narrative, then its code."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    doc = ast.get_docstring(tree, clean=True) or path.stem
    title, _, narrative = doc.partition("\n")
    code_from = tree.body[1].lineno if len(tree.body) > 1 else 1
    page = GENERATED / "tutorials" / f"{path.stem}.md"
    rel = Path(os.path.relpath(path, page.parent)).as_posix()
    narrative = site_links(narrative.strip(), path, page)
    return (
        f"# {title.strip()}\n\n{narrative}\n\n## The script\n\n"
        f"```{{literalinclude}} {rel}\n:language: python\n:lines: {code_from}-\n"
        f":lineno-start: {code_from}\n```\n"
    )


def tutorials_index(paths: list[Path]) -> str:
    lines = ["# Tutorials", "",
             "Numbered, narrated scripts that run to completion in seconds on a CPU "
             "(`python tutorials/01_dicttensor.py`); read them in order.", "",
             "```{toctree}", ":maxdepth: 1", ""]
    lines += [p.stem for p in paths]
    return "\n".join([*lines, "```", ""])


def tutorials() -> list[Path]:
    """The numbered tutorials, one page each."""
    return sorted((REPO / "tutorials").glob("[0-9][0-9]_*.py"))


def generated_pages() -> list[str]:
    """The pages :func:`generate` writes, relative to ``docs/generated/``."""
    return [
        "api/index.rst",
        *(f"api/{m}.rst" for m in API_MODULES),
        "tutorials/index.md",
        *(f"tutorials/{p.stem}.md" for p in tutorials()),
        "algos.md",
    ]


def generate(out: Path = GENERATED) -> None:
    """Write the generated pages (API reference, tutorials, algorithms README) under ``out``."""
    _write(out / "api" / "index.rst", api_index())
    for module in API_MODULES:
        _write(out / "api" / f"{module}.rst", api_page(module))
    _write(out / "tutorials" / "index.md", tutorials_index(tutorials()))
    for path in tutorials():
        _write(out / "tutorials" / f"{path.stem}.md", tutorial_page(path))
    readme = REPO / "rlstruct" / "algos" / "README.md"
    _write(out / "algos.md", site_links(readme.read_text(encoding="utf-8"), readme,
                                        out / "algos.md"))


def _builder_inited(app) -> None:
    from sphinx.ext.autodoc.mock import mock

    with mock(autodoc_mock_imports):
        generate()


#: Object types listed on their page's own table of contents (the right-hand sidebar): modules'
#: classes, functions, exceptions and data. Methods and attributes stay in the page only: in
#: the contents they made the site-wide tree, which the theme copies for each of the ~320
#: pages, a quarter of the build's time.
_CONTENTS_OBJTYPES = {"class", "function", "exception", "data", "module"}


def _contents_entries(app, doctree) -> None:
    """Marks the object descriptions that are not :data:`_CONTENTS_OBJTYPES` with Sphinx's
    ``no-contents-entry`` (what the ``:no-contents-entry:`` option sets; autodoc has no option
    for it), before the table of contents is collected from the page."""
    from sphinx import addnodes  # here: the tests import this module without the docs extra

    for desc in doctree.findall(addnodes.desc):
        if desc.get("objtype") not in _CONTENTS_OBJTYPES:
            desc["no-contents-entry"] = True


def setup(app):
    app.connect("doctree-read", _contents_entries, priority=400)  # before the toc collector's
    app.connect("builder-inited", _builder_inited)
    app.connect("source-read", _source_read)
    app.connect("autodoc-process-docstring", _process_docstring, priority=400)
    app.connect("autodoc-process-docstring", _restore_field_doc, priority=600)
    return {"parallel_read_safe": True}

"""The import graph of rlstruct/ and benchmarks/ against the layer table of docs/design.md.

Every module of ``rlstruct/`` has a layer in the table; an import (at module level or inside a
function) points to the same layer or a lower one; no modules import each other, directly or
through others; the library imports no script (``algos``, ``benchmarks``, ``tutorials``), not even
by name through ``importlib``. A string that names a module (``import_module(NAME)``, a
forkserver's preload list, a table of lazy names) counts as an import of it; the upward ones the
design makes on purpose are listed in ``NAMED_UPWARD`` with their reasons. In ``benchmarks/``,
helpers (``_name.py``) import no script and no import circle joins two scripts. Static
(``ast``): nothing is imported, so the test is fast.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ("benchmarks", "tutorials")


def layer_table() -> dict[str, int]:
    """``{name: layer}`` from the ```text block under "## Layers" of docs/design.md; names
    are relative to ``rlstruct`` (``""``: the package itself); higher layers have higher
    numbers."""
    text = (REPO / "docs" / "design.md").read_text()
    block = re.search(r"## Layers.*?```text\n(.*?)```", text, re.S)
    assert block, "docs/design.md has no layer table"
    layers: list[list[str]] = []
    continued = False
    for line in block.group(1).splitlines()[1:]:  # the first line is the scripts
        names = re.split(r"\s{2,}", line.strip())[0]
        if names.startswith("rlstruct") or (continued and names):
            parts = [n.strip() for n in names.split(",") if n.strip()]
            if not continued:
                layers.append([])
            layers[-1] += [p.removeprefix("rlstruct").lstrip(".") for p in parts]
            continued = names.endswith(",")
        else:
            continued = False
    return {name: len(layers) - i for i, names in enumerate(layers) for name in names}


def modules() -> dict[str, Path]:
    """Dotted names of the modules of rlstruct/ and benchmarks/."""
    out = {}
    for path in sorted((REPO / "rlstruct").rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        out[f"benchmarks.{path.stem}"] = path
    return out


MODULES = modules()
BENCH_NAMES = {name.split(".", 1)[1] for name in MODULES if name.startswith("benchmarks.")}


def _resolve(name: str, importer: str) -> str:
    """A benchmark script imports its neighbours by bare name (benchmarks/ is on sys.path)."""
    if importer.startswith("benchmarks.") and name.split(".")[0] in BENCH_NAMES:
        return f"benchmarks.{name}"
    return name


def imports(module: str) -> set[str]:
    """The project modules ``module`` imports anywhere in its file (functions included)."""
    path = MODULES[module]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {_resolve(alias.name, module) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else \
                    module.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            base = _resolve(base, module)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in MODULES else base)
        else:
            named = named_module(node)
            if named is not None:
                out.add(named)
    return {name for name in out if name != module
            and name.split(".")[0] in ("rlstruct", *SCRIPTS)}


def named_module(node: ast.AST) -> str | None:
    """The project module a string names, which counts as an import (``import_module(NAME)``,
    a forkserver's preload list, a table of lazy names): a constant that is exactly a module's
    dotted name, or an f-string whose constant start is a package's name and a dot
    (``f"rlstruct.algos.{name}"`` names ``rlstruct.algos``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if node.value in MODULES else None
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        start = str(node.values[0].value)
        if start.endswith(".") and start[:-1] in MODULES:
            return start[:-1]
    return None


GRAPH = {module: imports(module) for module in MODULES}


def layer_of(module: str, table: dict[str, int]) -> int | None:
    """The layer of an rlstruct module: its own entry or its nearest package's."""
    parts = module.split(".")[1:]
    for n in range(len(parts), -1, -1):
        name = ".".join(parts[:n])
        if name in table and (n > 0 or not parts):
            return table[name]
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


# ------------------------------------------------------------------------------------ tests
def test_the_table_parses_and_names_real_modules():
    table = layer_table()
    assert table["errors"] < table["blocks.functional"] < table["agent"] < table["batchers"]
    assert table["batchers"] < table["runs.run"] < table["tools"] < table["__main__"]
    assert table["tools"] < table["algos"] < table["__main__"]
    assert table[""] == table["batchers"]  # the package itself: its core names
    missing = [name for name in table if f"rlstruct.{name}".rstrip(".") not in MODULES]
    assert not missing, f"docs/design.md's layer table names modules that do not exist: {missing}"


def test_every_rlstruct_module_has_a_layer():
    table = layer_table()
    unplaced = [m for m in MODULES if m.startswith("rlstruct") and layer_of(m, table) is None]
    assert not unplaced, f"add these modules to the layer table of docs/design.md: {unplaced}"


#: The upward references by name that the design makes on purpose, each with its reason.
NAMED_UPWARD = {
    ("rlstruct", "rlstruct.runs.policy"):
        "load_policy, the one name the top level exports lazily (docs/design.md)",
    ("rlstruct.tools.sweep_plan", "rlstruct.algos"):
        "a sweep's sessions run the program `python -m rlstruct.algos.ALGO`; find_spec checks it",
    ("rlstruct.tools.optuna_search", "rlstruct.algos"):
        "an Optuna search checks its space file against the algorithm's Config, before any session",
}


def test_imports_point_down():
    table = layer_table()
    upward, exempt = [], set()
    for module, targets in GRAPH.items():
        if not module.startswith("rlstruct"):
            continue
        for target in targets:
            if target.split(".")[0] in SCRIPTS:
                upward.append(f"{module} imports the script {target}")
                continue
            mine, theirs = layer_of(module, table), layer_of(target, table)
            if theirs is not None and mine is not None and theirs > mine:
                if (module, target) in NAMED_UPWARD:
                    exempt.add((module, target))
                else:
                    upward.append(f"{module} (layer {mine}) imports {target} (layer {theirs})")
    assert not upward, "imports that point up:\n" + "\n".join(sorted(upward))
    assert exempt == set(NAMED_UPWARD), "stale NAMED_UPWARD entries: " + str(
        set(NAMED_UPWARD) - exempt)


def test_no_modules_import_each_other():
    assert not cycles(GRAPH), f"import circles: {cycles(GRAPH)}"


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_run_and_tune_do_not_import_each_other_even_through_others():
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for target in GRAPH.get(todo.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    tune = {m for m in MODULES
            if m == "rlstruct.tools.tune" or m.startswith("rlstruct.tools.tune.")}
    assert "rlstruct.runs.run" not in set().union(*(reach(m) for m in tune))


def test_benchmark_helpers_import_no_script():
    helpers = [m for m in MODULES if m.startswith("benchmarks._")]
    assert helpers
    bad = {m: sorted(t for t in GRAPH[m] if t.startswith("benchmarks.")) for m in helpers}
    assert not any(bad.values()), bad


def test_the_library_names_no_script_to_importlib():
    named = []
    for module in (m for m in MODULES if m.startswith("rlstruct")):
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            if not (isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args):
                continue
            first = node.args[0]
            text = first.value if isinstance(first, ast.Constant) else ""
            if isinstance(first, ast.JoinedStr) and first.values and isinstance(
                    first.values[0], ast.Constant):
                text = first.values[0].value
            if str(text).startswith(SCRIPTS):
                named.append(f"{module} imports {text!r}...")
    assert not named, f"the library never imports scripts, even by name: {named}"


def _is_dynamic_import(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("__import__", "import_module"))


def test_modules_named_in_strings_count_as_imports():
    lazy = imports("rlstruct")  # rlstruct/__init__.py: load_policy by name, through importlib
    assert "rlstruct.runs.policy" in lazy
    assert "rlstruct.algos" in imports("rlstruct.__main__")  # f"rlstruct.algos.{name}"
    # the forkserver's preload list of the Batcher's workers
    assert "rlstruct.batchers.process.worker" in imports("rlstruct.batchers.process.processes")
    assert named_module(ast.parse('"rlstruct.envs"').body[0].value) == "rlstruct.envs"
    assert named_module(ast.parse('"rlstruct.envs and more"').body[0].value) is None

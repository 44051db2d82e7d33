"""The benchmark commands the docs show (``python benchmarks/NAME.py ...``), as written: each
names a script that exists, or cites the commit it was removed after, and its arguments parse
with that script's own parser."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from test_docs import _FENCE, CITES_COMMIT, LINKED_PAGES, REPO, code_blocks

_BENCH = re.compile(r"\bpython (benchmarks/(\w+)\.py)([^`\n]*)")
_SPAN = re.compile(r"`([^`]+)`")
HELPER = Path(__file__).with_name("parse_benchmark_args.py")


def doc_benchmark_commands() -> list[tuple[str, str, str, str]]:
    """``(page, script, arguments, what follows)`` of every benchmark command of the pages: the
    lines of code blocks (continuation lines joined, trailing comments dropped) and inline code
    spans (which may break across lines); ``what follows`` is the page's next 80 characters
    after an inline span."""
    found = []
    for page in (p for p in LINKED_PAGES if p.suffix == ".md"):
        text, name = page.read_text(), page.relative_to(REPO).as_posix()
        for _lang, body in code_blocks(text):
            for line in body.replace("\\\n", " ").splitlines():
                for match in _BENCH.finditer(line):
                    found.append((name, match.group(1), re.split(r"\s#", match.group(3))[0], ""))
        prose = _FENCE.sub("", text)
        for span in _SPAN.finditer(prose):
            for match in _BENCH.finditer(span.group(1).replace("\n", " ")):
                found.append((name, match.group(1), match.group(3),
                              prose[span.end():span.end() + 80]))
    return found


def _args(text: str) -> list[str] | None:
    """The arguments as the shell passes them; ``None`` for a line with placeholders (``<...>``,
    ``...``). Optional parts in brackets (``[--compile]``) are left out."""
    if "<" in text or "..." in text:
        return None
    text = re.sub(r"\[[^\]]*\]", " ", text)
    return shlex.split(re.sub(r"\s&\s*$", "", text))


def test_the_benchmark_commands_of_the_docs_name_scripts_that_exist():
    """A script the docs name is in ``benchmarks/``, unless the docs cite the commit it is
    from (``of commit c33506d``): a figure of a script since removed."""
    commands = doc_benchmark_commands()
    assert len(commands) >= 30, len(commands)  # the extraction finds the docs' commands
    for page, script, args, after in commands:
        if not (REPO / script).is_file():
            assert CITES_COMMIT.match(after), (
                f"{page}: `python {script}{args}`: there is no {script}, and the page cites "
                f"no commit after it")


def test_the_benchmark_commands_of_the_docs_parse_as_written():
    """Every benchmark command of the docs whose script exists parses with the script's own
    ``argparse`` parser (called by its ``main``, stopped once parsed: nothing runs). A script
    that imports an optional package not installed here is left out; most need none."""
    wanted = []
    for page, script, args, _after in doc_benchmark_commands():
        argv = _args(args)
        if argv is not None and (REPO / script).is_file():
            wanted.append((page, script, argv))
    out = subprocess.run([sys.executable, str(HELPER)], cwd=REPO, capture_output=True,
                         text=True, timeout=300,
                         input=json.dumps([[script, argv] for _, script, argv in wanted]))
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)
    for (page, script, argv), result in zip(wanted, results, strict=True):
        assert result == "ok" or result.startswith("missing: "), (
            f"{page}: `python {script} {shlex.join(argv)}`: {result}")
    assert sum(r == "ok" for r in results) >= 25, list(zip(wanted, results, strict=True))

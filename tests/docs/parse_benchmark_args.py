"""Parses benchmark command lines without running them (a helper of test_doc_benchmarks.py).

Reads a JSON list of ``[script, [arg, ...]]`` on stdin. For each, imports ``benchmarks/<script>``
and calls its ``main()`` with ``sys.argv`` set to the arguments; ``argparse`` parses them as the
command would, and the first ``parse_args`` call then stops the script (nothing is run). Writes a
JSON list on stdout with one entry per command: ``"ok"``, ``"error: <argparse's message>"``,
``"missing: <module>"`` (an optional package the benchmark imports is not installed) or
``"unparsed"`` (``main`` returned without parsing its command line).

Runs in a subprocess of its own: benchmarks set thread counts and environment variables when
imported.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


class _ParsedError(Exception):
    """Raised by the patched ``parse_args`` once the arguments parsed."""


def _stop_after_parsing() -> None:
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _ParsedError

    argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]


def check(script: str, args: list[str]) -> str:
    """What parsing ``args`` with ``benchmarks/<script>``'s own parser gives (see the module)."""
    try:
        module = importlib.import_module(Path(script).stem)
    except ModuleNotFoundError as err:
        return f"missing: {err.name}"
    sys.argv = [script, *args]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            module.main()
    except _ParsedError:
        return "ok"
    except SystemExit as exit_:
        return "ok" if exit_.code in (0, None) else f"error: {err.getvalue().strip()[-400:]}"
    return "unparsed"


def main() -> None:
    sys.path.insert(0, str(BENCHMARKS))
    _stop_after_parsing()
    commands = json.load(sys.stdin)
    json.dump([check(script, args) for script, args in commands], sys.stdout)


if __name__ == "__main__":
    main()

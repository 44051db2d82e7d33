"""The docstrings written under dataclass fields: the ``--help`` text tyro shows for each flag,
and what the API reference shows for each attribute."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of a dataclass and of its dataclass bases (undocumented fields are
    left out)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, [*body[1:], None]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs

"""``pytest docs`` runs the ``>>>`` examples of the written pages (``--doctest-glob='*.md'``).

api.md is skipped: its examples are the docstrings' own, which need their module's names and run
with ``pytest rlstruct`` (``--doctest-modules``).
"""

collect_ignore = ["api.md"]

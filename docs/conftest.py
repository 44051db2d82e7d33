"""``pytest docs`` runs the ``>>>`` examples of the written pages (``--doctest-glob='*.md'``).

The site's configuration and what it generates or builds are not pages to test here.
"""

collect_ignore = ["conf.py", "generated", "_build"]

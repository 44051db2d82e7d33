"""Reference algorithms written with rlstruct: one readable, runnable file each.

Conventions (Config, main(), tests, speed targets): see rlstruct/algos/README.md.
"""

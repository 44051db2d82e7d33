"""The run scaffold: :mod:`~rlstruct.runs.run` (``Run``), :mod:`~rlstruct.runs.config`
(``RunConfig``), the device layout, the logger, checkpoints, the run folder and its plots.

Import the modules by name (``from rlstruct.runs.run import Run``); this package imports none of
them, so that ``import rlstruct.runs.folder`` stays light.
"""

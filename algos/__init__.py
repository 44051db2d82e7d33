"""Reference algorithms written with rlstruct: one readable, runnable file each."""

"""The command line: the ``mldiag`` program, the Invoke tasks generated from the registry,
flag parsing and exit codes. With ``diagnostics/api.py``, the only importer of Invoke."""

"""Hands mldiag's task namespace to Invoke: `inv --list`, `inv gpu-status -H trainbox`."""

import gc

from diagnostics import lean_imports
from diagnostics.tasks import ns  # noqa: F401

# What `inv` has imported so far lives until it exits: out of the cyclic GC's full passes, as
# the `mldiag` script does (diagnostics/entry.py), and paramiko with it when first imported.
gc.freeze()
lean_imports.freeze_what_imports_load()

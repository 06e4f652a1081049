"""Hands mldiag's task namespace to Invoke: `inv --list`, `inv gpu-status -H trainbox`.

A team's diagnostics are found as `mldiag` finds them (the hosts file's `diagnostics:`, the
installed `mldiag.diagnostics` packages); `inv` has no --diagnostics-dir (that flag is mldiag's).
"""

import gc
import sys

from diagnostics import cmdline, lean_imports, registry, team
from diagnostics.tasks import collection

found = team.discover(cmdline.hosts_file_in(sys.argv[1:]))
registry.use(found)
ns = collection(found)

# What `inv` has imported so far lives until it exits: out of the cyclic GC's full passes, as
# the `mldiag` script does (diagnostics/entry.py), and paramiko with it when first imported.
gc.freeze()
lean_imports.freeze_what_imports_load()

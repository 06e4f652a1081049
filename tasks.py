"""Hands mldiag's task namespace to Invoke: `inv --list`, `inv gpu-status -H trainbox`.

A team's diagnostics are found as `mldiag` finds them (the hosts file's `diagnostics:`, the
installed `mldiag.diagnostics` packages); `inv` has no --diagnostics-dir (that flag is mldiag's).
"""

import gc
import sys

from invoke import Program

from diagnostics.builtin import BUILTIN, NO_TEAM_NEEDED
from diagnostics.cli import cmdline
from diagnostics.cli.tasks import collection
from diagnostics.core import lean_imports
from diagnostics.engine import registry, team


def _needs_team(argv) -> bool:
    """As `mldiag` decides: a command line whose task is a built-in that needs no team's
    diagnostics (builtin.NO_TEAM_NEEDED) reads no hosts file and no team directory here."""
    core = Program()
    takes_value = [("--" if len(n) > 1 else "-") + n for a in core.core_args() + core.task_args()
                   if a.kind is not bool for n in a.names]
    return cmdline.first_word(argv, takes_value) not in NO_TEAM_NEEDED


found = team.discover(BUILTIN, cmdline.hosts_file_in(sys.argv[1:])) if _needs_team(sys.argv[1:]) \
    else BUILTIN
registry.use(found)
ns = collection(found)

# What `inv` has imported so far lives until it exits: out of the cyclic GC's full passes, as
# the `mldiag` script does (diagnostics/cli/entry.py), and paramiko with it when first imported.
gc.freeze()
lean_imports.freeze_what_imports_load()

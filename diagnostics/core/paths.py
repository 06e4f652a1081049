"""Where the package's own files are: computed once here from this file's place in the package,
so that moving a module moves nothing else (the remote scripts, the built-in runbooks, the
directory the connection holder is booted from)."""

import os

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # .../diagnostics
PACKAGE_PARENT = os.path.dirname(PACKAGE_DIR)       # what ``sys.path`` needs to import it
SCRIPTS_DIR = os.path.join(PACKAGE_DIR, "scripts")  # the remote scripts: sent, never imported here
RUNBOOKS_DIR = os.path.join(PACKAGE_DIR, "runbooks")  # the built-in runbook files (*.yaml)

"""The ``mldiag-node-health`` console script: node-check on this node, for slurm.conf's
``HealthCheckProgram=``, ``Prolog=`` and ``Epilog=`` (``builtin/node_check/here.py``).

slurmd starts it with no arguments, so everything has a default: the mode from
``SLURM_SCRIPT_CONTEXT``, the node from ``SLURMD_NODENAME``, a 30 s budget, drain/resume on.
A site that wants other settings names a two-line wrapper script that execs this one with
flags (docs/node-check.md shows both).

No Invoke, Fabric or Paramiko here: argparse, the engine and the local transport (the standard
library, PyYAML and ClusterShell, which the package's modules import). A test holds that.
"""

import argparse
import json
import os
import sys
from typing import List, Optional

from ..builtin import BUILTIN
from ..builtin.node_check import here
from ..core.errors import EXIT_BAD_INPUT, MldiagError
from ..engine import registry
from ..inventory.topology import EXPECT_KEYS


def parse_expect(text: str) -> dict:
    """``--expect '{"gpus": 8}'``: the hosts.yaml ``expect:`` keys, each a non-negative integer."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError('a JSON object, like {"gpus": 8}')
    for key, number in value.items():
        if key not in EXPECT_KEYS:
            raise argparse.ArgumentTypeError(f"unknown key {key!r} (known: {', '.join(EXPECT_KEYS)})")
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise argparse.ArgumentTypeError(f"{key}: a non-negative integer, got {number!r}")
    return value


class BadInput(Exception):
    """A flag argparse refused: exit 4 in the health check, 0 in a prolog or epilog (main)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise BadInput(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="mldiag-node-health",
        description="node-check on this node, as Slurm's HealthCheckProgram, Prolog or Epilog: "
                    "drains the node on a drain-level finding (never a node someone else "
                    "drained), resumes only its own drain once the node passes (health mode).")
    p.add_argument("--mode", choices=here.MODES,
                   help="health (default), prolog or epilog; default: from SLURM_SCRIPT_CONTEXT")
    p.add_argument("--node", help="the Slurm node name (default: $SLURMD_NODENAME, else the "
                                  "short host name)")
    p.add_argument("--budget", type=float, default=here.DEFAULT_BUDGET, metavar="SECONDS",
                   help="the whole run's time, hung tools and scontrol included (default "
                        "%(default)g; slurmd kills a health check at 60)")
    p.add_argument("--dry-run", action="store_true",
                   help="drain and resume nothing: print the scontrol commands that would run")
    p.add_argument("--prom", metavar="FILE.prom",
                   help="write node-exporter's textfile-collector file")
    p.add_argument("--expect", type=parse_expect, metavar="JSON",
                   help='what a healthy node has, as hosts.yaml expect: ({"gpus": 8, "ib_ports": 8})')
    for arg in here.forwarded_args():   # node-check's own (--kernel-log-file, --since, ...)
        kw = {"dest": "check_" + arg.python_name, "help": arg.help.replace("%", "%%")}
        if arg.kind == "bool":
            kw["action"] = "store_true"
        else:
            kw.update(metavar=arg.value_name, choices=arg.choices or None,
                      type=int if arg.kind == "int" else str)
        p.add_argument(f"--{arg.name}", **kw)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """The exit status (builtin/node_check/here.py). Bad input or an error of mldiag's own is
    said on stderr; in a prolog or epilog it exits 0 all the same, because a prolog that fails
    drains the node and requeues the job: only a finding may do that, never a typo in a wrapper
    script copied to every node."""
    health = here.mode_of(os.environ) == "health"
    registry.use(BUILTIN)
    try:
        args = build_parser().parse_args(argv)
        health = (args.mode or here.mode_of(os.environ)) == "health"
        return here.run(here.settings_from(args), sys.stdout)
    except BadInput as exc:
        sys.stderr.write(f"{exc}\n")
        return EXIT_BAD_INPUT if health else 0
    except MldiagError as exc:
        sys.stderr.write(f"mldiag-node-health: {exc}\n")
        return getattr(exc, "exit_code", EXIT_BAD_INPUT) if health else 0


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()

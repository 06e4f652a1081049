"""The task collection: thin @task wrappers over ``cli``; no logic lives here."""

import json as jsonlib
import os

from invoke import Collection, Exit, Task, task

from . import bundle, cli
from .topology import Target

# Invoke would give --host the short flag -h (taken by --help); ours are named, as in Fabric.
SHORT_FLAGS = {"host": "H", "group": "g"}


class MldiagTask(Task):
    """A Task whose only short flags are the ones in SHORT_FLAGS."""

    def __init__(self, *args, **kwargs):
        kwargs["auto_shortflags"] = False
        kwargs.setdefault("iterable", [])
        kwargs["iterable"] = list(kwargs["iterable"]) + ["host", "group"]
        super().__init__(*args, **kwargs)

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"] = opts["names"] + [SHORT_FLAGS[name]]
        return opts


COMMON_HELP = {
    "host": "target name, comma list or node set (gpu[01-04]); repeatable",
    "group": "group name from hosts.yaml; repeatable",
    "hosts-file": "hosts file (default: $MLDIAG_HOSTS_FILE, else ./hosts.yaml)",
    "json": "print the result documents as JSON (nothing else on stdout)",
    "save": "directory to write one JSON file per target plus summary.json",
    "parallel": f"targets run at once (default {32})",
    "timeout": "seconds the diagnostic may run on the target (default: hosts.yaml's, 300)",
    "keep-remote": "keep the remote temp dir for debugging (its path is in the result's data)",
}


def _help(**extra):
    return {**COMMON_HELP, **extra}


def _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote):
    return cli.Options(host=host, group=group, hosts_file=hosts_file, json=json, save=save,
                       parallel=parallel, timeout=timeout, keep_remote=keep_remote)


@task(klass=MldiagTask, help={k: COMMON_HELP[k] for k in ("host", "group", "hosts-file", "json")})
def hosts(c, host=None, group=None, hosts_file=None, json=False):
    """Show each target and its hop chain (no connection is made)."""
    cli.show_hosts(cli.Options(host=host or [], group=group or [], hosts_file=hosts_file, json=json))


@task(klass=MldiagTask, help=_help())
def ping(c, host=None, group=None, hosts_file=None, json=False, save=None, parallel=None,
         timeout=None, keep_remote=False):
    """Check every layer: ssh, jump, sudo, container, interpreter, private temp dir."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote)
    cli.execute(opts, bundle.script_job("ping"))


@task(klass=MldiagTask, help=_help())
def gpu_status(c, host=None, group=None, hosts_file=None, json=False, save=None, parallel=None,
               timeout=None, keep_remote=False):
    """Per GPU: model, memory, utilisation, temperature, power, ECC/remap health, throttling."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote)

    def job(target: Target):
        argv = ["--expect-gpus", str(target.gpus)] if target.gpus is not None else []
        return bundle.script_job("gpu-status", argv)

    cli.execute(opts, job)


@task(klass=MldiagTask, iterable=["arg", "put"], help=_help(
    path="local script to upload and run as __main__",
    arg="one argument for the script, byte for byte (repeatable; --arg=VALUE for values starting with -)",
    **{"args-json": "the script's whole argv as a JSON list of strings (exact, for any value)"},
    put="extra local file uploaded beside the script (repeatable)"))
def run_script(c, path, arg=None, args_json=None, put=None, host=None, group=None,
               hosts_file=None, json=False, save=None, parallel=None, timeout=None,
               keep_remote=False):
    """Upload any local script and run it with arguments through the same safe path."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote)
    argv = list(arg or [])
    if args_json is not None:
        try:
            extra = jsonlib.loads(args_json)
        except ValueError as exc:
            raise Exit(f"mldiag: --args-json: not JSON ({exc})", code=4)
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            raise Exit("mldiag: --args-json: expected a JSON list of strings", code=4)
        argv += extra
    cli.execute(opts, cli.script_file_job(path, argv, put or []))


ns = Collection(hosts, ping, gpu_status, run_script)
ns.configure({"run": {"echo": False}})

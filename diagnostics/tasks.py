"""The task collection: thin @task wrappers over the engine (``cli``, ``runbook_run``).

The engine returns an ``Outcome`` or raises an ``errors.MldiagError``; ``MldiagTask.__call__``
is the one place either becomes Invoke's ``Exit`` (the process's exit code and stderr).
"""

import json as jsonlib
import os

from typing import Optional

from invoke import Argument, Collection, Exit, Task, task

from . import cli, jobs, render, termination
from .errors import EXIT_ERROR, EXIT_OK, InputError, MldiagError
from .outcome import Outcome

# Invoke would give --host the short flag -h (taken by --help); ours are named, as in Fabric.
SHORT_FLAGS = {"host": "H", "group": "g"}


class MldiagTask(Task):
    """A Task whose only short flags are the ones in SHORT_FLAGS."""

    def __init__(self, *args, **kwargs):
        kwargs["auto_shortflags"] = False
        kwargs.setdefault("iterable", [])
        kwargs["iterable"] = list(kwargs["iterable"]) + ["host", "group"]
        super().__init__(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        """The task's outcome, or mldiag's error, as the process's exit (the one place a run
        becomes an ``Exit``; program.py adds Invoke's own parse errors). Never a raw traceback on the terminal: our own bugs are named, their traceback
        saved. SIGTERM and SIGHUP end the run as Ctrl-C does: exit 128 + signal
        (``termination``)."""
        with termination.terminates_like_ctrl_c():
            try:
                outcome = super().__call__(*args, **kwargs)
            except MldiagError as exc:   # bad input (4); a run interrupted after saving (130 ...)
                raise Exit(f"mldiag: {exc}", code=exc.exit_code)
            except KeyboardInterrupt as exc:   # before or after the engine's own handling
                raise Exit(f"mldiag: {termination.describe(exc)}",
                           code=termination.exit_code_of(exc))
            except BrokenPipeError:  # `mldiag ... | head`: the reader left; that is not an error
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                raise Exit(code=EXIT_OK)
            except Exception as exc:
                raise Exit(cli.internal_error(exc), code=EXIT_ERROR)
        if isinstance(outcome, Outcome) and (outcome.exit_code or outcome.messages):
            raise Exit(outcome.stderr_text(), code=outcome.exit_code)
        return outcome

    def get_arguments(self, *args, **kwargs):
        """A repeatable flag (``-H``, ``--arg``, ...) given last with no value is Invoke's
        "needed value" parse error, as for any other flag: Invoke starts list flags with a raw
        value of ``[]``, which its own check takes for a value, so a bare ``-H`` ran on the
        default targets."""
        arguments = super().get_arguments(*args, **kwargs)
        for argument in arguments:
            if argument.kind is list:
                argument.raw_value = None
        return arguments

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
    "diff": "after the table, show only the data fields that differ from the majority of targets",
}


def _help(**extra):
    """COMMON_HELP plus ``extra``; an entry set to None is left out."""
    return {k: v for k, v in {**COMMON_HELP, **extra}.items() if v is not None}


def _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff):
    return cli.Options(host=host, group=group, hosts_file=hosts_file, json=json, save=save,
                       parallel=parallel, timeout=timeout, keep_remote=keep_remote, diff=diff)


@task(klass=MldiagTask, help={k: COMMON_HELP[k] for k in ("host", "group", "hosts-file", "json")})
def hosts(c, host=None, group=None, hosts_file=None, json=False):
    """Show each target and its hop chain (no connection is made)."""
    cli.show_hosts(cli.Options(host=host or [], group=group or [], hosts_file=hosts_file, json=json))


@task(klass=MldiagTask, help=_help())
def ping(c, host=None, group=None, hosts_file=None, json=False, save=None, parallel=None,
         timeout=None, keep_remote=False, diff=False):
    """Check every layer: ssh, jump, sudo, container, interpreter, private temp dir."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff)
    return cli.execute(opts, jobs.job_source("ping", {}))


@task(klass=MldiagTask, help=_help(**jobs.help_for("gpu-status")))
def gpu_status(c, kernel_log_file=None, expect_idle=False, host=None, group=None, hosts_file=None,
               json=False, save=None, parallel=None, timeout=None, keep_remote=False, diff=False):
    """Per GPU: model, memory, utilisation, temperature, power, ECC/remap health, throttling."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff)
    job = jobs.job_source("gpu-status", dict(kernel_log_file=kernel_log_file, expect_idle=expect_idle))
    return cli.execute(opts, job, after_table=render.render_gpus)


@task(klass=MldiagTask, help=_help(**jobs.help_for("check-attn")))
def check_attn(c, model=None, attn_implementation=None, model_class=None, host=None, group=None,
               hosts_file=None, json=False, save=None, parallel=None, timeout=None,
               keep_remote=False, diff=False):
    """Requested vs resolved attention per module (meta-device build), layer types, fast kernels."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff)
    return cli.execute(opts, jobs.job_source("check-attn", dict(
        model=model, attn_implementation=attn_implementation, model_class=model_class)))


@task(klass=MldiagTask, help=_help(
    full="show every field on every target (default with several targets: only what differs)",
    **jobs.help_for("env-report")))
def env_report(c, full=False, imports=None, packages=None, host=None, group=None, hosts_file=None,
               json=False, save=None, parallel=None, timeout=None, keep_remote=False, diff=False):
    """python, torch (+CUDA, cuDNN, NCCL), driver, ML package versions, env vars; drift across targets."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff)
    opts.diff = opts.diff or not full
    job = jobs.job_source("env-report", dict(imports=imports, packages=packages))
    return cli.execute(opts, job, after_table=None if opts.diff else render.render_full)


@task(klass=MldiagTask, help=_help(**jobs.help_for("extract-smoke")))
def extract_smoke(c, model=None, layers=None, samples=None, data=None, backend=None,
                  max_tokens=None, device=None, dtype=None, host=None, group=None, hosts_file=None,
                  json=False, save=None, parallel=None, timeout=None, keep_remote=False, diff=False):
    """Hidden-state extraction smoke test: capture layers, check shapes, dtype, finiteness, stats."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff)
    return cli.execute(opts, jobs.job_source("extract-smoke", dict(
        model=model, layers=layers, samples=samples, data=data, backend=backend,
        max_tokens=max_tokens, device=device, dtype=dtype)))


@task(klass=MldiagTask, help=_help(**jobs.help_for("scan-log")))
def scan_log(c, path, lines=None, host=None, group=None, hosts_file=None, json=False, save=None,
             parallel=None, timeout=None, keep_remote=False, diff=False):
    """Classify a remote log: tracebacks, empty error messages, NaN loss, OOM, NCCL, Xid, kills."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff)
    return cli.execute(opts, jobs.job_source("scan-log", dict(path=path, lines=lines)))


@task(klass=MldiagTask, iterable=["arg", "put"], help=_help(
    path="local script to upload and run as __main__",
    arg="one argument for the script, byte for byte (repeatable; --arg=VALUE for values starting with -)",
    **{"args-json": "the script's whole argv as a JSON list of strings (exact, for any value)"},
    put="extra local file uploaded beside the script (repeatable)"))
def run_script(c, path, arg=None, args_json=None, put=None, host=None, group=None,
               hosts_file=None, json=False, save=None, parallel=None, timeout=None,
               keep_remote=False, diff=False):
    """Upload any local script and run it with arguments through the same safe path."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff)
    argv = list(arg or [])
    if args_json is not None:
        try:
            extra = jsonlib.loads(args_json)
        except ValueError as exc:
            raise InputError(f"--args-json: not JSON ({exc})")
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            raise InputError("--args-json: expected a JSON list of strings")
        argv += extra
    return cli.execute(opts, cli.script_file_job(path, argv, put or []))


class _ListFlag(Argument):
    """``runbook --list`` needs no NAME: seeing the flag fills the positional with ''."""
    fills: Optional[Argument] = None

    def set_value(self, value, cast=True):
        super().set_value(value, cast)
        if value and self.fills is not None and self.fills.value is None:
            self.fills.set_value("", cast=False)


class RunbookTask(MldiagTask):
    def get_arguments(self, *args, **kwargs):
        arguments = super().get_arguments(*args, **kwargs)
        by_name = {a.name: a for a in arguments}
        by_name["list_"].__class__ = _ListFlag
        by_name["list_"].fills = by_name["name"]
        return arguments


@task(klass=RunbookTask, positional=["name"], iterable=["param", "runbooks_dir"], help=_help(
    diff=None, name="the runbook to run (file NAME.yaml in a runbook directory)",
    json="print the report as JSON (the same as --format json; nothing else on stdout)",
    timeout="seconds each step's diagnostic may run on the target (default: the step's, "
            "else hosts.yaml's)",
    list="list the runbooks found, with their descriptions and parameters",
    param="a runbook parameter, NAME=VALUE (repeatable), e.g. --param log=/var/log/train.log",
    format="report format: md (default) or json (--json is the same as --format json)",
    save="directory to write report.md, report.json and each step's results (steps/NN-STEP/)",
    **{"runbooks-dir": "another directory of runbook files (repeatable; searched after the "
                       "built-in ones and hosts.yaml's runbooks:)"}))
def runbook(c, name=None, list_=False, param=None, runbooks_dir=None, format=None, host=None,
            group=None, hosts_file=None, json=False, save=None, parallel=None, timeout=None,
            keep_remote=False):
    """Run a runbook's steps on the targets and print one report (Markdown or JSON)."""
    from . import runbook_run   # here: every other task's start-up skips its import (~40 ms)
    if list_:
        return runbook_run.list_runbooks(hosts_file, runbooks_dir or [], as_json=json)
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, False)
    return runbook_run.execute(opts, name, params=param or [], runbooks_dirs=runbooks_dir or [],
                               fmt=format)


ns = Collection(hosts, ping, gpu_status, check_attn, env_report, extract_smoke, scan_log, run_script,
                runbook)
ns.configure({"run": {"echo": False}})

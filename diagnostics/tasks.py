"""The task collection: thin @task wrappers over ``cli``; no logic lives here."""

import json as jsonlib
import os

from invoke import Collection, Exit, Task, task

from . import bundle, cli, render
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

    def __call__(self, *args, **kwargs):
        """Never a raw traceback on the terminal: our own bugs are named, their traceback saved."""
        try:
            return super().__call__(*args, **kwargs)
        except Exit:
            raise
        except KeyboardInterrupt:
            raise Exit("mldiag: interrupted", code=130)
        except BrokenPipeError:  # `mldiag ... | head`: the reader left; that is not an error
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            raise Exit(code=0)
        except Exception as exc:
            raise Exit(cli.internal_error(exc), code=3)

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
    return {**COMMON_HELP, **extra}


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
    cli.execute(opts, bundle.script_job("ping"))


@task(klass=MldiagTask, help=_help())
def gpu_status(c, host=None, group=None, hosts_file=None, json=False, save=None, parallel=None,
               timeout=None, keep_remote=False, diff=False):
    """Per GPU: model, memory, utilisation, temperature, power, ECC/remap health, throttling."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff)

    def job(target: Target):
        argv = ["--expect-gpus", str(target.gpus)] if target.gpus is not None else []
        return bundle.script_job("gpu-status", argv)

    cli.execute(opts, job, after_table=render.render_gpus)


def _model_argv(target: Target, model):
    """``--model`` may name an entry of the target's ``models:``; default: its first entry."""
    models = dict(target.models)
    path = models.get(model, model) if model else target.default_model
    if not path:
        raise cli.TargetInputError(f"{target.name}: no --model given and the target has no models: "
                                   "entry in hosts.yaml")
    return ["--model", path]


@task(klass=MldiagTask, help=_help(
    model="model directory on the target, or a name from the target's models: (default: its first)",
    **{"attn-implementation": "request this implementation (eager, sdpa, flash_attention_2, ...)",
       "model-class": "build this transformers class instead of the checkpoint's architectures"}))
def check_attn(c, model=None, attn_implementation=None, model_class=None, host=None, group=None,
               hosts_file=None, json=False, save=None, parallel=None, timeout=None,
               keep_remote=False, diff=False):
    """Requested vs resolved attention per module (meta-device build), layer types, fast kernels."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff)

    def job(target: Target):
        argv = _model_argv(target, model)
        if attn_implementation:
            argv += ["--attn-implementation", attn_implementation]
        if model_class:
            argv += ["--model-class", model_class]
        return bundle.script_job("check-attn", argv)

    cli.execute(opts, job)


@task(klass=MldiagTask, help=_help(
    full="show every field on every target (default with several targets: only what differs)",
    imports="packages to import as well: comma list, 'all' or 'none'",
    packages="extra distribution names to report, comma separated"))
def env_report(c, full=False, imports=None, packages=None, host=None, group=None, hosts_file=None,
               json=False, save=None, parallel=None, timeout=None, keep_remote=False, diff=False):
    """python, torch (+CUDA, cuDNN, NCCL), driver, ML package versions, env vars; drift across targets."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff)
    argv = (["--imports", imports] if imports else []) + (["--packages", packages] if packages else [])
    opts.diff = opts.diff or not full
    cli.execute(opts, bundle.script_job("env-report", argv),
                after_table=None if opts.diff else cli.render_full)


@task(klass=MldiagTask, help=_help(
    model="model directory on the target, or a name from the target's models: (default: its first)",
    layers="hidden_states ids to capture, e.g. 2,16,29 (default: 2, N//2, N-3 and N)",
    samples="number of built-in prompts (or lines of --data) to prefill (default 3)",
    data="JSONL file on the target with a 'text' or 'prompt' field per line",
    backend="auto | transformers | vllm (vllm: untested on a real GPU so far)",
    **{"max-tokens": "truncate each sample to at most N tokens (default 64)"},
    device="auto | cpu | cuda", dtype="auto | float32 | bfloat16 | float16"))
def extract_smoke(c, model=None, layers=None, samples=None, data=None, backend=None,
                  max_tokens=None, device=None, dtype=None, host=None, group=None, hosts_file=None,
                  json=False, save=None, parallel=None, timeout=None, keep_remote=False, diff=False):
    """Hidden-state extraction smoke test: capture layers, check shapes, dtype, finiteness, stats."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff)
    flags = {"--layers": layers, "--samples": samples, "--data": data, "--backend": backend,
             "--max-tokens": max_tokens, "--device": device, "--dtype": dtype}
    extra = [x for flag, value in flags.items() if value is not None for x in (flag, str(value))]

    def job(target: Target):
        return bundle.script_job("extract-smoke", _model_argv(target, model) + extra)

    cli.execute(opts, job)


@task(klass=MldiagTask, help=_help(path="log file on the target", lines="scan the last N lines (default 2000)"))
def scan_log(c, path, lines=None, host=None, group=None, hosts_file=None, json=False, save=None,
             parallel=None, timeout=None, keep_remote=False, diff=False):
    """Classify a remote log: tracebacks, empty error messages, NaN loss, OOM, NCCL, Xid, kills."""
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff)
    argv = ["--path", path] + (["--lines", str(lines)] if lines is not None else [])
    cli.execute(opts, bundle.script_job("scan-log", argv))


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
            raise Exit(f"mldiag: --args-json: not JSON ({exc})", code=4)
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            raise Exit("mldiag: --args-json: expected a JSON list of strings", code=4)
        argv += extra
    cli.execute(opts, cli.script_file_job(path, argv, put or []))


ns = Collection(hosts, ping, gpu_status, check_attn, env_report, extract_smoke, scan_log, run_script)
ns.configure({"run": {"echo": False}})

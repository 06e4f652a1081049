"""What one run sends: the Job (a diagnostic, its arguments and files) and the header the
runtime reads.  The wire format itself (bootstrap, payload framing, result frames) is
``diagnostics/core/wire.py``; the names re-exported below keep older callers working.
"""

import hashlib
import json
import os
import secrets
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from . import registry
from ..core import wire
from ..core.wire import BOOT, OLD_PYTHON_MARK, STAGE_A, bootstrap_argv, parse_payload

__all__ = ["BOOT", "OLD_PYTHON_MARK", "STAGE_A", "Job", "bootstrap_argv", "build_header",
           "build_payload", "job_files", "new_nonce", "parse_payload", "script_job"]

SCRIPTS_DIR = registry.SCRIPTS_DIR


def _read_runtime() -> bytes:
    with open(os.path.join(SCRIPTS_DIR, "_runtime.py"), "rb") as f:
        return f.read()


_RUNTIME = _read_runtime()


@lru_cache(maxsize=128)
def code_digest(source: bytes) -> str:
    """SHA-256 (hex) of one of our own files, the name it has in a target's code cache
    (scripts/_stage_a.py)."""
    return hashlib.sha256(source).hexdigest()


@dataclass(frozen=True)
class Job:
    """One diagnostic run, independent of where it runs."""
    diagnostic: str                      # task name, e.g. "gpu-status" or "run-script"
    script_name: str                     # file name inside the bundle
    script_source: bytes
    argv: Sequence[str] = ()
    mode: str = "diagnostic"             # "diagnostic": run(args) -> dict; "script": __main__ + exit code
    extra_files: Dict[str, bytes] = field(default_factory=dict)
    keep_remote: bool = False
    timeout: Optional[float] = None      # overrides the target's timeout
    # Looks at this job's result on a target and may return a second job to run there in its
    # place (same connection, same Slurm allocation): stacks ships py-spy only to a target
    # that said it has none. The second job's follow_up is not consulted.
    follow_up: Optional[Callable[[Any], Optional["Job"]]] = field(default=None, compare=False)
    # mldiag's own code (script_job: the script and its companions), which a target may keep
    # compiled in its code cache; a user's script (run-script) never is.
    own_code: bool = False
    # a team's diagnostic (team.py): its run() value is sent as it is and checked by the client,
    # which names the file (wire.take_returned)
    team: bool = False


REMOTE_HELPER = "_remote.py"


def _read_script_file(name: str, directory: str = SCRIPTS_DIR) -> bytes:
    with open(os.path.join(directory, name), "rb") as f:
        return f.read()


def script_job(diagnostic: str, argv: Sequence[str] = (), **kw) -> Job:
    """A Job for a registered diagnostic (``gpu-status`` → ``scripts/gpu_status.py``), with
    the companion files its spec names: files it imports or reads from its own directory,
    shipped beside it (the run's private temp dir is on the script's sys.path)."""
    spec = registry.get(diagnostic)
    extra = {companion: _read_script_file(companion, spec.directory)
             for companion in spec.companions}
    # the scripts' shared helpers (scripts/_remote.py), beside every diagnostic, a team's too
    extra.setdefault(REMOTE_HELPER, _read_script_file(REMOTE_HELPER))
    extra.update(kw.pop("extra_files", {}))
    kw.setdefault("own_code", spec.builtin)
    kw.setdefault("team", not spec.builtin)
    kw.setdefault("timeout", spec.timeout)
    return Job(diagnostic=diagnostic, script_name=spec.script_name,
               script_source=_read_script_file(spec.script_name, spec.directory),
               argv=tuple(argv), extra_files=extra, **kw)


def build_header(job: Job, *, target: str, timeout: float, env: Dict[str, str],
                 activate: Sequence[str], python: str, nonce: str,
                 tmpdir: Optional[str] = None, code_cache: bool = False) -> dict:
    """``code_cache``: the target may keep our code compiled (hosts.yaml ``code_cache``); the
    header then names the digest of the job's script when it is one of ours (``code_digests``;
    the runtime's own digest rides on its length line, see ``build_payload``)."""
    header = {"v": 1, "nonce": nonce, "diagnostic": job.diagnostic, "target": target,
              "mode": job.mode, "script": job.script_name, "argv": list(job.argv),
              "env": dict(env), "timeout": timeout, "keep": job.keep_remote,
              "activate": list(activate), "python": python}
    if tmpdir:
        header["tmpdir"] = tmpdir
    if job.team and job.mode == "diagnostic":
        header["returned"] = True
    if job.own_code and job.mode == "diagnostic":
        args = parsed_args(job.script_name, job.script_source, tuple(job.argv))
        if args is not None:
            header["args"] = args
    if code_cache:
        header["code_digests"] = {job.script_name: code_digest(job.script_source)} if job.own_code else {}
    return header


@lru_cache(maxsize=32)
def _script_parser(name: str, source: bytes) -> Optional[Callable[[], Any]]:
    """``build_parser`` of our script ``name`` whose text is ``source``, loaded on this side (from
    its compiled ``__pycache__`` copy when the file is unchanged); None when it has none."""
    path = os.path.join(SCRIPTS_DIR, name)
    try:
        same_file = _read_script_file(name) == source
    except OSError:
        same_file = False
    module_name = "mldiag_parse_" + name[:-3]
    if same_file:
        from importlib.machinery import SourceFileLoader
        code = SourceFileLoader(module_name, path).get_code(module_name)
    else:
        code = compile(source, path, "exec", dont_inherit=True)
    namespace = {"__name__": module_name, "__file__": path, "__builtins__": _beside_scripts()}
    exec(code, namespace)
    return namespace.get("build_parser")


@lru_cache(maxsize=1)
def _beside_scripts() -> Dict[str, Any]:
    """Builtins for a script's code run here whose ``import _remote`` finds scripts/_remote.py,
    as it does on the target (the runtime puts the script's directory first on sys.path): that
    module loaded by its path under a name of its own, for these scripts only; this process's
    sys.path and any ``_remote`` it may have stay as they are."""
    import builtins
    import importlib.util
    spec = importlib.util.spec_from_file_location("mldiag_parse__remote",
                                                  os.path.join(SCRIPTS_DIR, REMOTE_HELPER))
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    plain_import = builtins.__import__

    def scripts_import(name, globals=None, locals=None, fromlist=(), level=0):
        if name == REMOTE_HELPER[:-3] and level == 0:
            return helper
        return plain_import(name, globals, locals, fromlist, level)
    return dict(vars(builtins), __import__=scripts_import)


def _refuse(*args, **kwargs):
    raise ValueError("refused")


_PARSING = threading.Lock()   # a fan-out's threads build their headers at once: one parses


def parsed_args(name: str, source: bytes, argv: Tuple[str, ...]) -> Optional[Dict[str, Any]]:
    """The script's arguments as its ``build_parser().parse_args(argv)`` gives them, parsed here
    once for every target that gets the same argv: the runtime then skips argparse (its import
    and a parser: ~9 ms of CPU on each target). None where the target must parse them itself,
    as it does for a user's script: argv the parser refuses (the target reports it, as before),
    or values that JSON would not bring back unchanged. The scripts' parsers read nothing of
    the machine they run on (their defaults are constants; tests/unit/test_parsed_args.py),
    so the answer is the target's own."""
    with _PARSING:
        return _parsed_args(name, source, argv)


@lru_cache(maxsize=256)
def _parsed_args(name: str, source: bytes, argv: Tuple[str, ...]) -> Optional[Dict[str, Any]]:
    try:
        build = _script_parser(name, source)
        if build is None:
            return None
        parser = build()
        # argparse prints usage, errors and --help and exits; here it may do neither (the
        # fan-out's other threads keep sys.stdout and sys.stderr): the target does it instead
        parser._print_message = lambda message, file=None: None
        parser.exit = parser.error = _refuse
        values = vars(parser.parse_args(list(argv)))
    except (Exception, SystemExit):
        return None
    try:
        same = json.loads(json.dumps(values)) == values
    except (TypeError, ValueError):
        return None
    return values if same else None


def build_payload(header: dict, files: Dict[str, bytes]) -> bytes:
    """The bytes written to the bootstrap's stdin: stage A, our runtime (with its digest when the
    header allows the target's code cache), the header, the files."""
    digest = code_digest(_RUNTIME) if "code_digests" in header else ""
    return wire.build_payload(_RUNTIME, header, files, runtime_digest=digest)


def new_nonce() -> str:
    return secrets.token_hex(8)


def job_files(job: Job) -> Dict[str, bytes]:
    files = {job.script_name: job.script_source}
    for name, data in job.extra_files.items():
        if name in files:
            raise ValueError(f"--put {name}: clashes with the script's own name")
        files[name] = data
    return files

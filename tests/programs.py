"""The programs under test, started the way a user starts them: ``mldiag`` (and ``inv``) in a
subprocess, importing this checkout's ``diagnostics`` wherever the test runs it; and the remote
scripts, loaded alone as modules.

One place for the argv and the environment, so that every test runs the same program the
same way; a test says only what differs (its directory, its timeout, its extra variables).
Only the standard library here: the lab's self-tests use it too, without importing mldiag.
"""

import atexit
import contextlib
import functools
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Optional, Tuple

REPO = str(Path(__file__).resolve().parents[1])
MLDIAG = [sys.executable, "-c", "from diagnostics.cli.entry import main; main()"]
INV = [sys.executable, "-m", "invoke"]
# Never inherited from the shell that runs pytest: a developer's own hosts file would otherwise
# decide which targets a test reaches. A test that wants it passes it in ``env``.
HOSTS_FILE_ENV = "MLDIAG_HOSTS_FILE"
SCRIPTS = Path(REPO) / "diagnostics" / "scripts"


# hosts.yaml's alphabet for a `python:` value (diagnostics/inventory/yamlfile.py SAFE_TOKEN), repeated
# here because this module imports nothing of mldiag.
_SAFE_TOKEN = re.compile(r"[A-Za-z0-9_@%+,./:-]+")


def space_free_python() -> str:
    """A path to this interpreter that hosts.yaml's ``python:`` accepts, wherever the checkout is:
    what a test names as a target's interpreter instead of ``sys.executable``.

    CI makes the virtualenv inside the checkout (``.venv``), so a checkout under a path with a
    space gives ``sys.executable`` a space, which the safe alphabet of ``python:`` refuses (on
    purpose: the value lands on remote command lines; tests/integration/test_command_lines.py
    checks every local command line of the run too). So: ``space_free(sys.executable)``, a
    wrapper that execs the real interpreter: same pid, and ``sys.executable`` there (the
    ``executable`` a target reports) is the real one, with the venv's site-packages (a symbolic
    link would lose them: Python looks for ``pyvenv.cfg`` beside the path it was started by)."""
    return space_free(sys.executable)


@functools.lru_cache(maxsize=None)
def space_free(program: str) -> str:
    """A path that runs PROGRAM (an executable; its arguments passed on) and is a safe token,
    for a target's interpreter or a local command line: an executable ``/bin/sh`` wrapper,
    ``exec '<PROGRAM>' "$@"``, written once per process into a directory of its own (mkdtemp)
    under the temporary directory, mode 0755 and the file too (the lab's unprivileged users run
    it as they could run PROGRAM). Always the wrapper, not only when PROGRAM's path has a space,
    so that every run goes the way a run from a checkout with a space goes."""
    directory = _wrappers_directory()
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(program))
    wrapper = os.path.join(directory, f"{len(os.listdir(directory))}-{name}")
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\nexec {shlex.quote(program)} "$@"\n')
    os.chmod(wrapper, 0o755)
    return wrapper


@functools.lru_cache(maxsize=None)
def _wrappers_directory() -> str:
    """The directory of ``space_free``'s wrappers, made on first use, gone when Python exits."""
    directory = tempfile.mkdtemp(prefix="mldiag-programs-")
    if not _SAFE_TOKEN.fullmatch(directory):
        os.rmdir(directory)
        raise RuntimeError(f"the temporary directory {directory!r} is no safe token either: "
                           "set TMPDIR to a directory without spaces")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    os.chmod(directory, 0o755)
    return directory


def marking_python(directory) -> Tuple[Path, Path]:
    """(an interpreter, its mark) for a local target in a test that checks whether anything ran
    on it: DIRECTORY/python-marking, a /bin/sh wrapper that creates DIRECTORY/ran, then execs
    this interpreter (quoted: a checkout's ``.venv`` may have a space in its path)."""
    python, mark = Path(directory) / "python-marking", Path(directory) / "ran"
    python.write_text(f'#!/bin/sh\n: > {shlex.quote(str(mark))}\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    return python, mark


def program_env(env: Optional[Mapping[str, str]] = None, unset: Iterable[str] = ()) -> dict:
    """This process's environment, this checkout first on PYTHONPATH (a test run from a
    temporary directory still imports this copy), without ``$MLDIAG_HOSTS_FILE`` and
    ``unset``, with ``env`` over it."""
    full = dict(os.environ)
    for name in (HOSTS_FILE_ENV, *unset):
        full.pop(name, None)
    full["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, full.get("PYTHONPATH")) if p)
    full.update(env or {})
    return full


def run_program(argv, *, cwd=REPO, timeout: float = 120, env: Optional[Mapping[str, str]] = None,
                unset: Iterable[str] = (), input: Optional[str] = None,
                **popen_kw) -> subprocess.CompletedProcess:
    """``argv`` (str()-ed) to its end, text output captured."""
    return subprocess.run([str(a) for a in argv], cwd=str(cwd), env=program_env(env, unset),
                          capture_output=True, text=True, timeout=timeout, input=input, **popen_kw)


def mldiag(*argv, **kw) -> subprocess.CompletedProcess:
    """``mldiag ARGV...``; keywords as for ``run_program``."""
    return run_program(MLDIAG + list(argv), **kw)


def inv(*argv, **kw) -> subprocess.CompletedProcess:
    """``inv ARGV...`` (the Invoke front end over the same tasks)."""
    return run_program(INV + list(argv), **kw)


def ok(proc: subprocess.CompletedProcess) -> str:
    """The stdout of a command that had to succeed; else the assertion shows all it said."""
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout={proc.stdout}\nstderr={proc.stderr}"
    return proc.stdout


def start_mldiag(*argv, cwd=REPO, env: Optional[Mapping[str, str]] = None,
                 unset: Iterable[str] = (), **popen_kw) -> subprocess.Popen:
    """``mldiag ARGV...`` left running (to be signalled, or read while it runs): stdout and
    stderr are pipes unless ``popen_kw`` says otherwise."""
    popen_kw.setdefault("stdout", subprocess.PIPE)
    popen_kw.setdefault("stderr", subprocess.PIPE)
    popen_kw.setdefault("preexec_fn", _as_a_terminal_would_start_it)
    return subprocess.Popen(MLDIAG + [str(a) for a in argv], cwd=str(cwd),
                            env=program_env(env, unset), text=True, **popen_kw)


@contextlib.contextmanager
def running_mldiag(*argv, **kw) -> Iterator[subprocess.Popen]:
    """``start_mldiag`` for a ``with`` block: whatever the test does, the process is gone after
    it (killed if the test failed before it ended)."""
    proc = start_mldiag(*argv, **kw)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def signal_and_wait(proc: subprocess.Popen, sig: int, timeout: float) -> Tuple[str, str]:
    """Send ``sig``; its stdout and stderr once it has ended (TimeoutExpired past ``timeout``)."""
    proc.send_signal(sig)
    return proc.communicate(timeout=timeout)


def _as_a_terminal_would_start_it() -> None:
    """SIGINT and SIGQUIT at their defaults in the child. A shell starts a background job (`cmd &`
    without job control: a CI wrapper, `nohup ... &`) with both ignored, the ignore is inherited,
    and a program keeps an inherited SIG_IGN (Python installs no KeyboardInterrupt handler then):
    the Ctrl-C tests would send SIGINT into the void."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def findings_by_code(doc) -> dict:
    """A result document's findings by their code (a later one of the same code wins), for a
    test that looks findings up by code."""
    return {f["code"]: f for f in doc["findings"]}


# Three targets in the lab's CT 200 (behind `pve: {address: main, become: sudo}`), each with the
# fake nvidia-smi answering another capture: 8 healthy H200s, 8 H200s with one lost, one RTX
# 2080. The entries of a `containers:` mapping, indented for the hosts.yaml the tests write.
# hosts.yaml's head for CTs of the lab's `main` reached as pct targets (ssh main, sudo, pct);
# the containers' lines follow, indented six spaces
PCT_HOSTS_HEAD = """\
defaults: {connect_timeout: 5, timeout: 120}
hosts:
  pve:
    address: main
    become: sudo
    containers:
"""

GPU_STATUS_CONTAINERS = """\
      trainbox:
        runtime: pct
        id: "200"
        python: /root/venv/bin/python
        gpus: 8
        env: {MLDIAG_FAKE_NVIDIA_SMI: derived__h200x8__healthy}
      sickbox:
        runtime: pct
        id: "200"
        python: /root/venv/bin/python
        gpus: 8
        env: {MLDIAG_FAKE_NVIDIA_SMI: derived__h200x8__gpu-lost}
      consumer:
        runtime: pct
        id: "200"
        python: /root/venv/bin/python
        env: {MLDIAG_FAKE_NVIDIA_SMI: linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05}
"""


FAKE_NVIDIA_SMI = Path(REPO) / "tests" / "fakes" / "nvidia-smi"
NVIDIA_SMI_CAPTURES = Path(REPO) / "tests" / "fixtures" / "nvidia-smi"


@functools.lru_cache(maxsize=None)
def fake_nvidia_smi_module():
    """tests/fakes/nvidia-smi (a file without .py) loaded as a module: its capture reader."""
    import importlib.machinery
    loader = importlib.machinery.SourceFileLoader("mldiag_test_fake_nvidia_smi", str(FAKE_NVIDIA_SMI))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def captured_section(capture: str, what: str, phase: str) -> str:
    """One section of a recorded nvidia-smi capture, as nvidia-smi printed it."""
    text = (NVIDIA_SMI_CAPTURES / capture).read_text(encoding="utf-8")
    return "\n".join(fake_nvidia_smi_module().read_sections(text)[(phase, what)]) + "\n"


def run_fake_nvidia_smi(*argv, capture: Optional[str] = None) -> subprocess.CompletedProcess:
    """The fake nvidia-smi as a program (``python3 -S``), answering from ``capture`` (or its
    default) whatever MLDIAG_FAKE_NVIDIA_SMI* this process has."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLDIAG_FAKE_NVIDIA_SMI")}
    if capture:
        env["MLDIAG_FAKE_NVIDIA_SMI"] = capture
    return subprocess.run([sys.executable, "-S", str(FAKE_NVIDIA_SMI)] + list(argv),
                          capture_output=True, text=True, env=env, timeout=60)


def codes(findings) -> list:
    """The codes of ``findings`` (dicts, as a script or a document has them), in their order."""
    return [f["code"] for f in findings]


def level_codes(findings) -> list:
    """``(level, code)`` of each of ``findings`` (dicts), in their order."""
    return [(f["level"], f["code"]) for f in findings]


def result_of(diagnostic: str, target: str = "t", *findings, status=None, summary: str = "", data=None):
    """A result as the engine hands it on: ``findings`` (core Findings), ``status`` by default
    their worst level as a status (``ok`` without any)."""
    from diagnostics.core.results import STATUSES, Result, level_rank
    if status is None:
        status = STATUSES[max([0] + [level_rank(f.level) for f in findings])]
    return Result(diagnostic=diagnostic, target=target, status=status, summary=summary,
                  findings=list(findings), data=data if data is not None else {})


def node_check_finding(code: str, action: str, level: str = "fail"):
    """A node-check finding that asks for ``action`` (drain, undrain and the Prometheus file
    read only those)."""
    from diagnostics.core.results import Finding
    return Finding(level=level, code=code, message=f"{code} happened", action=action)


def node_check_result(target: str, status: str = "ok", *findings, data=None):
    """A node-check result of ``target`` with ``findings``, as the engine hands it on."""
    return result_of("node-check", target, *findings, status=status, data=data)


def script_imports(path, *, module_level: bool = False) -> set:
    """The top-level names of what the Python file at ``path`` imports (``os`` for
    ``os.path``), its syntax read as Python 3.8's (a SyntaxError otherwise): every import, or with
    ``module_level`` those its import itself runs (the module's body and its ``try:`` blocks)."""
    import ast
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), str(path), feature_version=(3, 8))
    if module_level:
        nodes = [n for top in tree.body for n in ([top] + (top.body if isinstance(top, ast.Try) else []))]
    else:
        nodes = list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def load_module(path, name: str):
    """The Python file at ``path`` as a fresh module called ``name``, imported alone: a remote
    script is a single file (importing it only defines things), so it is tested without the
    package around it; tests/ml/mlenv.py is loaded so too. Its directory is put first on
    sys.path, as the runtime puts the run's (where scripts/_remote.py lies beside it)."""
    directory = os.path.dirname(os.path.abspath(str(path)))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_script(file_name: str, name: str):
    """diagnostics/scripts/FILE_NAME as a module called ``name``."""
    return load_module(SCRIPTS / file_name, name)

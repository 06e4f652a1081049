"""The README's first section ("Start here"), followed literally, as a new user would: in a fresh
copy of the repository, with the very commands it shows.

What "literally" means here:
- The first section is README.md's first `## ` heading up to the next one. Its fenced blocks are
  read in order: ```` ```sh ```` blocks are run as written (each one command line, by `bash -c`,
  in the copy's root), the ```` ```yaml ```` block is the hosts.yaml the section tells the user to
  save in the directory they run `inv` from (the test writes it there, over the checkout's
  example), and a ```` ```text ```` block right after a command is what that command prints.
- The fresh copy is `git ls-files` of this working tree (the tracked files, as they are on disk),
  copied into a temporary directory: exactly what a clone holds, yet the README and code being
  edited are what is tested (a `git clone` would test the last commit instead). Nothing of this
  checkout's `.venv`, egg-info or caches travels. The section's first command makes the copy's own
  `.venv` and installs the project into it with pip (from the package registries pip is
  configured for: in CI, the network).
- The commands run in a newcomer's environment: no `PYTHONPATH`, no active virtualenv (its
  `bin` is taken off `PATH`, so `python3` is the system's), no `$MLDIAG_HOSTS_FILE`, an empty
  `$XDG_CONFIG_HOME`. The suite's command-line recording (`$MLDIAG_RECORD_COMMANDS`) stays on, so
  test_command_lines.py checks what these commands sent as well.
- Commands on `local` (or no target) run as they are: the first run's output is compared with
  the README's when this machine is the README's case (no NVIDIA driver), else checked for its
  table and the exit status its worst status gives; `inv hosts` must print the README's text.
- Commands that select the README's own machine (`-H trainbox`) cannot reach 10.1.2.6: they run
  against the lab's stand-in of the same shape — the README's hosts.yaml with the address and
  port of the lab's `main` sshd, everything else kept (user root, pct 200, /root/venv/bin/python,
  a `models:` entry), plus an `env:` that lets the CT's venv import this machine's torch and
  transformers, and `models.target` pointing at a tiny Qwen3-Next-style model. The README's log
  path (/var/log/extract.log) holds, in the CT, the recorded log the README shows scan-log on.
  check-attn and scan-log must then print the README's text; every other command a table (or a
  report) and the exit status of its worst status.

Timing (Debian 12, 2 cores, pip reading a local package mirror): the install and first run
about 7 s, the other steps 0.2-5 s each, the module 25 s with the lab (70 s on a loaded machine).
With pip reaching a remote registry (CI) the install step takes longer: its limit is 15 minutes.
"""

import json
import os
import re
import shlex
import shutil
import sys
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.test_diagnostics_remote import VENV_PY, tiny_models_in_ct

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
HOSTS_FILE_DOC = REPO / "docs" / "hosts-file.md"
LOGS = REPO / "tests" / "fixtures" / "logs"
EXIT_OF = {"ok": 0, "warn": 1, "fail": 2, "error": 3}
CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
INSTALL_TIMEOUT = 900    # pip from a remote registry in CI
COMMAND_TIMEOUT = 300


# ------------------------------------------------------------------ reading the README

def sections(text):
    """[(heading, body)] of the `## ` sections (fences respected: a `## ` inside one is text)."""
    out, heading, body, fence = [], None, [], None
    for line in text.splitlines(keepends=True):
        m = re.match(r"^(`{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif line.strip() == fence:
                fence = None
        if fence is None and line.startswith("## "):
            if heading is not None:
                out.append((heading, "".join(body)))
            heading, body = line[3:].strip(), []
        elif heading is not None:
            body.append(line)
    if heading is not None:
        out.append((heading, "".join(body)))
    return out


def fenced_blocks(body):
    """[(info, text)] of the fenced blocks of ``body``, in order."""
    blocks, fence, info, lines = [], None, None, []
    for line in body.splitlines(keepends=True):
        if fence is None:
            m = re.match(r"^(`{3,})(.*)$", line.rstrip("\n"))
            if m:
                fence, info, lines = m.group(1), m.group(2).strip(), []
        elif line.rstrip("\n") == fence:
            blocks.append((info, "".join(lines)))
            fence = None
        else:
            lines.append(line)
    assert fence is None, "an unclosed fence in the README's first section"
    return blocks


def first_section():
    heading, body = sections(README.read_text())[0]
    return heading, fenced_blocks(body)


def steps():
    """The first section as [(command, expected output or None)] plus its hosts.yaml text."""
    _, blocks = first_section()
    commands, hosts_yaml = [], None
    for info, text in blocks:
        kind = info.split()[0] if info else ""
        if kind == "sh":
            lines = [ln for ln in text.splitlines() if ln.strip()]
            assert len(lines) == 1, f"one command per sh block (one exit status to check): {text!r}"
            commands.append([lines[0], None, hosts_yaml is not None])
        elif kind == "text":
            assert commands and commands[-1][1] is None, f"a text block follows no command: {text!r}"
            commands[-1][1] = text
        elif kind == "yaml":
            assert hosts_yaml is None, "one hosts.yaml in the first section"
            hosts_yaml = text
        else:
            raise AssertionError(f"a block the test cannot follow (say sh, yaml or text): {info!r}")
    return commands, hosts_yaml


# ------------------------------------------------------------------ running it

def newcomer_env(home_config):
    env = dict(os.environ)
    venv = env.pop("VIRTUAL_ENV", None)
    for name in ("PYTHONPATH", "PYTHONHOME", "MLDIAG_HOSTS_FILE", "NO_COLOR", "FORCE_COLOR"):
        env.pop(name, None)
    path = env.get("PATH", "").split(os.pathsep)
    drop = {str(Path(venv) / "bin")} if venv else set()
    drop.add(str(Path(sys.executable).parent))   # the suite's own interpreter's bin
    env["PATH"] = os.pathsep.join(p for p in path if p and p not in drop)
    env["XDG_CONFIG_HOME"] = str(home_config)
    return env


def fresh_copy(dest):
    """The tracked files of this working tree, copied to ``dest`` (see the module docstring)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        msg = "the README test copies `git ls-files`: needs git and a git checkout"
        if CI:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    names = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src, dst = REPO / name, dest / name
        if not os.path.lexists(src):        # deleted in the working tree, not yet committed
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
    return dest


def run(command, cwd, env, timeout):
    t0 = time.monotonic()
    r = subprocess.run(["bash", "-c", command], cwd=str(cwd), env=env, capture_output=True,
                       text=True, timeout=timeout)
    return r, time.monotonic() - t0


def shown(r):
    return f"rc={r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"


def table_of(r):
    """The result table at the end of ``r``'s stdout: (its lines, the exit status it implies)."""
    out = r.stdout
    at = out.rfind("TARGETS ")
    assert at >= 0 and (at == 0 or out[at - 1] == "\n"), f"no result table\n{shown(r)}"
    lines = out[at:].rstrip("\n").splitlines()
    assert lines[0].split()[:3] == ["TARGETS", "STATUS", "SUMMARY"], shown(r)
    summary = lines[-1]
    counts = re.findall(r"(\d+) (ok|warn|fail|error)\b", summary)
    assert counts and re.fullmatch(r"\d+ \w+( \([^)]*\))?( · \d+ \w+( \([^)]*\))?)*", summary), \
        f"no summary line\n{shown(r)}"
    worst = max((status for _, status in counts), key=EXIT_OF.get)
    return lines, EXIT_OF[worst]


def report_of(r, name):
    """A runbook's Markdown report on stdout: the exit status its Result line names."""
    assert r.stdout.startswith(f"# Runbook `{name}`\n"), shown(r)
    m = re.search(r"^- \*\*Result:\*\* (\w+) \(exit (\d)\)", r.stdout, re.M)
    assert m, shown(r)
    assert EXIT_OF[m.group(1)] == int(m.group(2)), shown(r)
    return int(m.group(2))


def readme_targets(hosts_yaml):
    """The target names the README's hosts.yaml defines (hosts and their containers)."""
    doc = yaml.safe_load(hosts_yaml)
    names = set()
    for host, fields in (doc.get("hosts") or {}).items():
        names.add(host)
        names.update((fields or {}).get("containers") or {})
    return names


def lab_shaped(hosts_yaml, lab, env, model):
    """The README's hosts.yaml, reaching the lab: every host's address and port are the lab's
    `main` sshd; every container gets ``env`` and its first model becomes ``model``."""
    doc = yaml.safe_load(hosts_yaml)
    for fields in doc["hosts"].values():
        fields["address"] = lab.main.address
        fields["port"] = lab.main.port
        for ct in (fields.get("containers") or {}).values():
            ct["env"] = {**ct.get("env", {}), **env}
            if ct.get("models"):
                first = next(iter(ct["models"]))
                ct["models"][first] = str(model)
    return yaml.safe_dump(doc, sort_keys=False)


def names_a_readme_target(command, targets):
    words = shlex.split(command)
    return any(w in ("-H", "--host") and i + 1 < len(words) and words[i + 1] in targets
               for i, w in enumerate(words))


@pytest.fixture(scope="module")
def walkthrough(lab, tmp_path_factory):
    """Every step of the first section, run in order: {command: (result, seconds, expected)}."""
    commands, hosts_yaml = steps()
    assert hosts_yaml, "the first section describes one machine in a hosts.yaml block"
    targets = readme_targets(hosts_yaml) - {"local"}
    base = tmp_path_factory.mktemp("readme")
    copy = fresh_copy(base / "mldiag")
    (base / "config").mkdir()
    env = newcomer_env(base / "config")

    # the lab's stand-in for the README's machine
    lab.need("lxc")
    models_root, models, ml_env, _, _ = tiny_models_in_ct(lab, "readme")
    lab_yaml = lab_shaped(hosts_yaml, lab, ml_env, models["qwen3next"]["path"])
    log = (LOGS / "extract_empty_errors.log").read_text()
    put_log = ("import os, sys; os.makedirs('/var/log', exist_ok=True); "
               "open('/var/log/extract.log', 'w').write(sys.stdin.read())")
    r = lab.ssh("main-root", shlex.join(["pct", "exec", "200", "--", VENV_PY, "-c", put_log]), input=log)
    assert r.returncode == 0, r.stderr

    done = {}
    try:
        for command, expected, after_yaml in commands:
            needs_host = names_a_readme_target(command, targets)
            if after_yaml:
                (copy / "hosts.yaml").write_text(lab_yaml if needs_host else hosts_yaml)
            timeout = INSTALL_TIMEOUT if "pip install" in command else COMMAND_TIMEOUT
            result, seconds = run(command, copy, env, timeout)
            done[command] = (result, seconds, expected, needs_host)
            print(f"README step ({seconds:.1f} s, exit {result.returncode}): {command}")
    finally:
        lab.ssh("main-root", shlex.join(["pct", "exec", "200", "--", VENV_PY, "-c",
                                         "import os; os.remove('/var/log/extract.log')"]))
        shutil.rmtree(models_root, ignore_errors=True)
    return {"copy": copy, "steps": done, "hosts_yaml": hosts_yaml}


def step(walkthrough, pattern):
    found = [(c, *v) for c, v in walkthrough["steps"].items() if re.search(pattern, c)]
    assert len(found) == 1, f"the first section has one command matching {pattern!r}: {list(walkthrough['steps'])}"
    return found[0]


# ------------------------------------------------------------------ the checks

def test_the_first_section_is_a_newcomers_path():
    heading, blocks = first_section()
    assert heading == "Start here"
    commands, hosts_yaml = steps()
    first = commands[0][0]
    # the one command that does all set-up on a fresh machine and runs the main job on `local`
    assert first == "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/inv gpu-status"
    assert hosts_yaml and any("check-attn" in c for c, _, _ in commands) \
        and any("extract-smoke" in c for c, _, _ in commands) and any(" runbook " in c for c, _, _ in commands)


def test_install_and_first_run_on_local(walkthrough):
    command, r, seconds, expected, _ = step(walkthrough, r"pip install")
    copy = walkthrough["copy"]
    assert (copy / ".venv" / "bin" / "mldiag").exists() and (copy / ".venv" / "bin" / "inv").exists()
    where = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-c",
                            "import diagnostics; print(diagnostics.__file__)"],
                           capture_output=True, text=True, env=newcomer_env(copy), cwd="/")
    assert where.stdout.strip() == str(copy / "diagnostics" / "__init__.py"), where
    lines, exit_status = table_of(r)
    assert lines[1].split()[0] == "local", shown(r)
    assert r.returncode == exit_status, shown(r)
    if "no NVIDIA driver tools found" in lines[1]:   # the README's case: its text, to the byte
        assert expected and r.stdout.endswith(expected), f"README shows:\n{expected}\n{shown(r)}"
        assert r.returncode == 1
    assert "Traceback" not in r.stderr, shown(r)


def test_hosts_shows_the_readme_machine(walkthrough):
    command, r, seconds, expected, _ = step(walkthrough, r"inv hosts$")
    assert r.returncode == 0, shown(r)
    assert expected and r.stdout == expected, f"README shows:\n{expected}\n{shown(r)}"


def test_ping_reaches_every_layer_of_the_readme_shape(walkthrough):
    command, r, seconds, expected, on_lab = step(walkthrough, r" ping ")
    assert on_lab
    lines, exit_status = table_of(r)
    assert r.returncode == 0 == exit_status, shown(r)
    assert lines[1].split()[:2] == ["trainbox", "ok"], shown(r)


def test_check_attn_says_what_the_readme_says(walkthrough):
    command, r, seconds, expected, on_lab = step(walkthrough, r"check-attn")
    assert on_lab and expected
    assert r.stdout == expected and r.returncode == 1, f"README shows:\n{expected}\n{shown(r)}"


def test_scan_log_says_what_the_readme_says(walkthrough):
    command, r, seconds, expected, on_lab = step(walkthrough, r"scan-log")
    assert on_lab and expected
    assert r.stdout == expected and r.returncode == 2, f"README shows:\n{expected}\n{shown(r)}"


def test_extract_smoke_ends_in_a_table_and_its_exit_status(walkthrough):
    command, r, seconds, expected, on_lab = step(walkthrough, r"extract-smoke")
    assert on_lab
    lines, exit_status = table_of(r)
    assert lines[1].split()[0] == "trainbox" and r.returncode == exit_status, shown(r)
    assert "Traceback" not in r.stderr, shown(r)


def test_the_runbooks_report_and_exit_status(walkthrough):
    for pattern, name, target in ((r"runbook node-health", "node-health", "local"),
                                  (r"runbook extraction-fails", "extraction-fails", "trainbox")):
        command, r, seconds, expected, on_lab = step(walkthrough, pattern)
        assert on_lab == (target != "local")
        assert report_of(r, name) == r.returncode, shown(r)
        assert f"- **Targets:** {target} (1)\n" in r.stdout, shown(r)


def test_ci_runs_the_readme_test_command():
    """.ci/run ends in exactly the test command the README's Tests section names."""
    tests = dict(sections(README.read_text()))["Tests"]
    assert "    bash .ci/run\n" in tests
    command = re.search(r"runs the test command `([^`]+)`", tests.replace("\n", " ")).group(1)
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()
          if ln.strip() and not ln.lstrip().startswith("#")]
    assert ci[-1] == f"exec {command}"
    assert f"the test command alone is `.venv/bin/{command}`" in tests.replace("\n", " ")


def test_the_reference_hosts_yaml_loads_in_the_installed_mldiag(walkthrough, tmp_path):
    """The walk-through of docs/hosts-file.md (the README links it) is a valid hosts file, and
    `mldiag hosts` (the console script pip installed, from another directory) prints the chains
    it shows."""
    body = HOSTS_FILE_DOC.read_text()
    blocks = fenced_blocks(body)
    example = next(text for info, text in blocks if info == "yaml")
    shown_rows = next(text for info, text in blocks if info == "" and text.startswith("TARGET "))
    (tmp_path / "hosts.yaml").write_text(example)
    mldiag = walkthrough["copy"] / ".venv" / "bin" / "mldiag"
    r = subprocess.run([str(mldiag), "hosts", "--hosts-file", str(tmp_path / "hosts.yaml")],
                       cwd=str(tmp_path), env=newcomer_env(tmp_path), capture_output=True, text=True,
                       timeout=COMMAND_TIMEOUT)
    assert r.returncode == 0, shown(r)
    rows = {" ".join(line.split()) for line in r.stdout.splitlines()}
    for line in shown_rows.splitlines():
        assert " ".join(line.split()) in rows, f"docs/hosts-file.md shows {line!r}\n{shown(r)}"

"""Issue 11 items 7, 9, 11, 16 and --no-color, through the real ``mldiag`` and ``inv`` programs:
the script's arguments after ``--``, an ``--arg`` value Invoke took as a flag refused, the
hosts file lookup and its messages, ``run-script -c CODE`` and ``run-script -``, mldiag's own
help, and colour on a terminal only."""

import json
import os

import pytest

from diagnostics.cli import cmdline
from diagnostics.inventory import topology
from tests.programs import inv, mldiag, ok
from tests.terminal import run_on_screen

# Values a shell hands over as they are and a careless layer would change.
HOSTILE = ["--json", "-H", "foo", "a b", "it's", 'say "hi"', "$(id)", "`id`", "line1\nline2",
           "naïve ☃ 日本", "", "--", "-c", "--arg=x", "*", "~root", " lead", "tab\there"]
ECHO = "import json, sys\nsys.stdout.write(json.dumps(sys.argv[1:]))\n"
# Code handed to -c as it is: quotes of both kinds, $(), backticks, globs, non-ASCII, newlines.
CODE = ("import json, sys\n"
        "S = \"naïve ☃ $(id) `id` 'sq' \\\"dq\\\" {a,b} * ~root \\\\ \"\n"
        "sys.stdout.write(json.dumps([S] + sys.argv[1:]))\n")
S_VALUE = "naïve ☃ $(id) `id` 'sq' \"dq\" {a,b} * ~root \\ "


def program(name):
    return mldiag if name == "mldiag" else inv


def script_stdout(r):
    """The one target's script stdout, parsed (``--json`` output)."""
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    docs = json.loads(r.stdout)
    assert len(docs) == 1 and docs[0]["status"] == "ok", docs
    return json.loads(docs[0]["data"]["stdout"])


@pytest.fixture
def echo(tmp_path):
    path = tmp_path / "echo.py"
    path.write_text(ECHO)
    return path


# ---------------------------------------------------------------------------- item 7: --

@pytest.mark.parametrize("name", ["mldiag", "inv"])
def test_everything_after_double_dash_reaches_the_script_byte_for_byte(name, echo):
    r = program(name)("run-script", echo, "-H", "local", "--json", "--", *HOSTILE)
    assert script_stdout(r) == HOSTILE


@pytest.mark.parametrize("name", ["mldiag", "inv"])
def test_arg_args_json_and_double_dash_in_that_order(name, echo):
    r = program(name)("run-script", echo, "--arg", "a b", "--arg=-x", "--args-json",
                      json.dumps(["--json", "-H"]), "-H", "local", "--json", "--", "-H", "foo")
    assert script_stdout(r) == ["a b", "-x", "--json", "-H", "-H", "foo"]


@pytest.mark.parametrize("name", ["mldiag", "inv"])
@pytest.mark.parametrize("argv, value", [
    (["--arg=--json"], "--json"),
    (["--arg=-H"], "-H"),
    (["--arg", "--json"], "--json"),
    (["--arg", "ok", "--arg=--json"], "--json"),
    (["--arg", "ok", "--arg", "-H", "--arg", "foo"], "-H"),
    (["--arg=--keep-remote"], "--keep-remote"),
])
def test_an_arg_invoke_read_as_a_flag_is_refused_with_the_way_out(name, echo, argv, value):
    r = program(name)("run-script", echo, *argv)
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert r.stderr == (
        f"mldiag: --arg {value!r}: Invoke reads {value!r} as one of run-script's own flags, so "
        f"the script would not get it. Put the script's arguments after `--` (run-script SCRIPT "
        f"-- {value} ...) or give them as JSON (--args-json '{json.dumps([value])}')\n")


@pytest.mark.parametrize("name", ["mldiag", "inv"])
def test_a_second_host_value_read_as_a_flag_is_refused(name):
    r = program(name)("ping", "-H", "local", "-H", "--json")
    assert r.returncode == 4 and r.stdout == "", (r.stdout, r.stderr)
    assert "'--json'" in r.stderr and "--host" in r.stderr


@pytest.mark.parametrize("name", ["mldiag", "inv"])
def test_double_dash_on_a_task_that_passes_nothing_on_is_refused(name):
    r = program(name)("ping", "-H", "local", "--", "x")
    assert r.returncode == 4 and r.stdout == ""
    assert r.stderr == ("mldiag: `--`: ping takes no arguments after `--` (only run-script "
                        "does, for its script)\n")


def test_written_values_follow_invokes_reading():
    flags = [cmdline.Flag("arg", repeatable=True), cmdline.Flag("put", repeatable=True),
             cmdline.Flag("host", "H", repeatable=True), cmdline.Flag("json", takes_value=False)]
    arg = flags[0]
    assert cmdline.written_values(["x.py", "--arg", "--arg=x", "--put", "--arg", "-Hbox"],
                                  arg, flags) == ["--arg=x"]
    assert cmdline.written_values(["--arg=", "--arg"], arg, flags) == ["", None]
    assert cmdline.written_values(["-Hbox", "-H=a", "-H", "b"], flags[2], flags) == \
        ["box", "a", "b"]
    assert cmdline.lost_values(["a", "--json", "a"], ["a", "a"]) == ["--json"]
    assert cmdline.split_remainder(["a", "--", "--", "b"]) == (["a"], ["--", "b"])


# ---------------------------------------------------------------------------- item 11: -c, -

@pytest.mark.parametrize("name", ["mldiag", "inv"])
def test_inline_code_runs_with_its_arguments(name):
    r = program(name)("run-script", "-c", CODE, "--arg", "x", "-H", "local", "--json", "--",
                      *HOSTILE)
    assert script_stdout(r) == [S_VALUE, "x", *HOSTILE]


@pytest.mark.parametrize("name", ["mldiag", "inv"])
def test_the_script_from_stdin_runs_with_its_arguments(name):
    r = program(name)("run-script", "-", "--args-json", json.dumps(["j"]), "-H", "local",
                      "--json", "--", "a b", "--json", input=CODE)
    assert script_stdout(r) == [S_VALUE, "j", "a b", "--json"]


def test_inline_code_failure_is_the_scripts(tmp_path):
    r = mldiag("run-script", "-c", "import sys; sys.exit(3)", "--json", cwd=tmp_path)
    assert r.returncode == 2
    assert json.loads(r.stdout)[0]["data"]["exit_code"] == 3


def test_code_and_a_script_path_together_are_refused(echo):
    r = mldiag("run-script", echo, "-c", "print(1)")
    assert r.returncode == 4 and r.stdout == ""
    assert r.stderr == f"mldiag: run-script: give a script ({str(echo)!r}) or -c CODE, not both\n"


def test_run_script_without_a_script_names_the_three_ways():
    r = mldiag("run-script")
    assert r.returncode == 4 and r.stdout == ""
    assert r.stderr == ("mldiag: 'run-script' did not receive required positional arguments: "
                        "'path' (usage: mldiag run-script [options] SCRIPT | -c CODE | -  "
                        "[-- ARG...])\n")


# ---------------------------------------------------------------------------- item 9: hosts file

HOSTS = "hosts:\n  trainbox: {local: true}\n"


def bare_env(tmp_path, **extra):
    """HOME and XDG_CONFIG_HOME of the test's own: nobody's real ~/.config is read."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "XDG_CONFIG_HOME": "", **extra}


def test_unknown_target_with_no_hosts_file_says_where_mldiag_looked(tmp_path):
    r = mldiag("ping", "-H", "trainbox", cwd=tmp_path, env=bare_env(tmp_path))
    assert r.returncode == 4 and r.stdout == ""
    assert r.stderr == (
        "mldiag: unknown target 'trainbox' (known: local)\n"
        f"mldiag: no hosts file found (looked for {tmp_path}/hosts.yaml and "
        f"{tmp_path}/home/.config/mldiag/hosts.yaml), so the only target is 'local': write one "
        "there, or name one with --hosts-file or $MLDIAG_HOSTS_FILE\n")


def test_unknown_target_names_the_hosts_file_read(tmp_path):
    (tmp_path / "hosts.yaml").write_text(HOSTS)
    r = mldiag("ping", "-H", "trainbx", cwd=tmp_path, env=bare_env(tmp_path))
    assert r.returncode == 4
    assert r.stderr == ("mldiag: unknown target 'trainbx' (did you mean 'trainbox'? known: "
                        "local,trainbox)\n"
                        f"mldiag: hosts file: {tmp_path}/hosts.yaml (from ./hosts.yaml)\n")


@pytest.mark.parametrize("xdg", [True, False])
def test_the_users_own_hosts_file_is_found_from_any_directory(tmp_path, xdg):
    config = tmp_path / "cfg" if xdg else tmp_path / "home" / ".config"
    (config / "mldiag").mkdir(parents=True)
    (config / "mldiag" / "hosts.yaml").write_text(HOSTS)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = bare_env(tmp_path, **({"XDG_CONFIG_HOME": str(config)} if xdg else {}))
    assert json.loads(ok(mldiag("ping", "-H", "trainbox", "--json", cwd=elsewhere, env=env))
                      )[0]["target"] == "trainbox"
    r = mldiag("hosts", cwd=elsewhere, env=env)
    assert ok(r) == "TARGET    CHAIN\nlocal     local → python3\ntrainbox  local → python3\n"
    assert r.stderr == (f"mldiag: hosts file: {config}/mldiag/hosts.yaml (from user config)\n"
                        "mldiag: without -H/-g: local\n")


@pytest.mark.parametrize("name", ["mldiag", "inv"])
def test_hosts_names_the_file_it_read_on_stderr(name, tmp_path):
    (tmp_path / "h.yaml").write_text(DEFAULTS)
    r = program(name)("hosts", "--hosts-file", tmp_path / "h.yaml", "--json")
    assert [row["name"] for row in json.loads(ok(r))] == ["local", "trainbox"]
    assert r.stderr == (f"mldiag: hosts file: {tmp_path}/h.yaml (from --hosts-file)\n"
                        "mldiag: without -H/-g: local,trainbox (defaults.targets)\n")


def test_the_lookup_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    user = tmp_path / "cfg" / "mldiag" / "hosts.yaml"
    user.parent.mkdir(parents=True)
    user.write_text(HOSTS)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    assert topology.find_hosts_file(None, env) == topology.HostsFile(str(user), "user config")
    (tmp_path / "hosts.yaml").write_text(HOSTS)
    assert topology.find_hosts_file(None, env) == topology.HostsFile("hosts.yaml", "./hosts.yaml")
    env["MLDIAG_HOSTS_FILE"] = "e.yaml"
    assert topology.find_hosts_file(None, env) == topology.HostsFile("e.yaml", "$MLDIAG_HOSTS_FILE")
    assert topology.find_hosts_file("f.yaml", env) == topology.HostsFile("f.yaml", "--hosts-file")
    # a relative XDG_CONFIG_HOME is ignored (XDG spec): ~/.config instead
    assert topology.user_hosts_file({"XDG_CONFIG_HOME": "rel"}) == \
        os.path.join(os.path.expanduser("~"), ".config", "mldiag", "hosts.yaml")


DEFAULTS = "defaults: {targets: [trainbox, local]}\nhosts:\n  trainbox: {local: true}\n"


def test_defaults_targets_are_said_on_a_terminal(tmp_path):
    (tmp_path / "hosts.yaml").write_text(DEFAULTS)
    status, screen = run_on_screen("ping", "--no-color", cwd=str(tmp_path), env=bare_env(tmp_path),
                                   width=300)
    assert status == 0, screen
    assert screen.splitlines()[0] == (f"mldiag: no -H/-g: running on defaults.targets from "
                                      f"{tmp_path}/hosts.yaml: local,trainbox")
    status, screen = run_on_screen("ping", "-H", "trainbox", cwd=str(tmp_path),
                                   env=bare_env(tmp_path))
    assert status == 0 and "defaults.targets" not in screen, screen


def test_defaults_targets_are_not_said_on_a_pipe(tmp_path):
    (tmp_path / "hosts.yaml").write_text(DEFAULTS)
    r = mldiag("ping", cwd=tmp_path, env=bare_env(tmp_path))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "trainbox" in r.stdout


# ---------------------------------------------------------------------------- item 16: help

ROOT_HELP = """\
Usage: mldiag TASK [options]   run TASK on the targets -H/-g name (else on
                               the hosts file's defaults.targets)
       mldiag TASK --help      TASK's own options
       mldiag --help | --version | --list

Runs prewritten diagnostics on ML machines (this one, SSH hosts, hosts behind a jump host,
containers on them, Slurm nodes) inside the right Python, and prints one result per target.

Tasks:
  hosts          Show each target and its hop chain, and which hosts file was read (no connection is
                 made).
  ping           Check every layer: ssh, jump, sudo, container, interpreter, private temp dir.
  gpu-status     Per GPU: model, memory, utilisation, temperature, power, ECC/remap health,
                 throttling.
  check-attn     Requested vs resolved attention per module (meta-device build), layer types, fast
                 kernels.
  env-report     python, torch (+CUDA, cuDNN, NCCL), driver, ML package versions, env vars; drift
                 across targets.
  extract-smoke  Hidden-state extraction smoke test: capture layers, check shapes, dtype,
                 finiteness, stats.
  scan-log       Classify a remote log: tracebacks, empty error messages, NaN loss, OOM, NCCL, Xid,
                 kills.
  node-check     A GPU node's hardware health: Xid with an action, NVLink, fabric, PCIe, IB, DCGM.
  nccl-check     A node's collective bus bandwidth (nccl-tests, else torch.distributed), against its
                 figure and its peers.
  gpu-perf       Each GPU under load: GEMM TFLOPS, HBM and host<->device GB/s, against its model's
                 figures and its peers.
  nccl-ras       NCCL's own view of a job's communicators (its RAS port, NCCL 2.24+): missing ranks,
                 ranks behind, errors.
  step-times     Per-rank step times from a job's logs (Megatron, DeepSpeed, torchtitan, Lightning,
                 HF Trainer): the slow rank.
  stacks         Where every rank of a hung job is: each process's Python stack, folded, the odd one
                 named.
  run-script     Upload a local script (or -c CODE, or - for stdin) and run it with arguments on the
                 targets.
  runbook        Run a runbook's steps on the targets and print one report (Markdown or JSON).
  baseline-init  Write a golden config (YAML to review): the fleet's majority of node-check's facts.
  baseline-diff  Show what drifted from a golden config: per node and fact, golden value and now.

Common options (every task):
  -H NAME, --host=NAME     target name, comma list or node set (gpu[01-04]); repeatable
  -g GROUP, --group=GROUP  group name from the hosts file; repeatable
  --hosts-file=FILE        the hosts file (default: the first of $MLDIAG_HOSTS_FILE, ./hosts.yaml,
                           $XDG_CONFIG_HOME/mldiag/hosts.yaml; `mldiag hosts` says which)
  --json                   print the result documents as JSON (nothing else on stdout)
  --jsonl                  print each result as one JSON line as it arrives, then a summary line
                           (JSON Lines, for pipelines; nothing else on stdout)
  --save=DIR               directory to write one JSON file per target plus summary.json
  --junit=FILE             also write a JUnit XML report to FILE (one testsuite per diagnostic, one
                           testcase per target and check), for CI test reports
  --parallel=N             targets run at once (default 32)
  --timeout=SECONDS        seconds the diagnostic may run on the target (default: hosts.yaml's, 300)
  --keep-remote            keep the remote temp dir for debugging (its path is in the result's data)
  --diff                   after the table, show only the data fields that differ from the majority
                           of targets
  --no-color               no colour (also off when NO_COLOR is set or the output is not a terminal)

The hosts file names the targets and how to reach them; mldiag reads the first it finds of
  1. --hosts-file FILE
  2. $MLDIAG_HOSTS_FILE
  3. ./hosts.yaml (in the current directory)
  4. $XDG_CONFIG_HOME/mldiag/hosts.yaml (~/.config/mldiag/hosts.yaml when that is unset)
With none of them, the only target is 'local' (this machine). Without -H/-g a task runs on the
file's defaults.targets (default: local). `mldiag hosts` lists the targets and names the file it
read.
Here and now: hosts file: {here}/hosts.yaml (from ./hosts.yaml)

Exit codes: 0 ok, 1 warn, 2 fail, 3 error (a target could not be checked), 4 bad input, 130 interrupted.

Other options:
  -h [TASK], --help[=TASK]    this help, or TASK's (the same as mldiag TASK --help)
  -V, --version               mldiag's version
  -l, --list                  the tasks and what each answers
  --diagnostics-dir=DIR       a directory of your own diagnostics (NAME.py files; repeatable; after
                              the hosts file's diagnostics:)
  --print-completion-script=SHELL
                              tab completion for bash, zsh or fish
"""

# Invoke's core flags that mean nothing to mldiag: neither shown nor taken.
NOT_OURS = ["--prompt-for-sudo-password", "-e", "--echo", "-R", "--dry", "-w", "--warn-only",
            "-p", "--pty", "-T", "--command-timeout", "--hide", "--write-pyc", "-f", "--config",
            "-d", "--debug", "-D", "--list-depth", "-F", "--list-format"]


@pytest.mark.parametrize("argv", [["--help"], [], ["-h"]])
def test_mldiag_help_is_mldiags(tmp_path, argv):
    (tmp_path / "hosts.yaml").write_text(HOSTS)
    r = mldiag(*argv, cwd=tmp_path, env=bare_env(tmp_path, COLUMNS="100"))
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout == ROOT_HELP.replace("{here}", str(tmp_path))
    words = r.stdout.replace(",", " ").replace("=", " ").split()
    assert not set(NOT_OURS) & set(words)


@pytest.mark.parametrize("flag", ["--prompt-for-sudo-password", "-e", "-R", "-w", "-p",
                                  "--hide=both", "--write-pyc", "-T", "--debug"])
def test_invokes_own_flags_are_refused_with_what_to_use(flag):
    for argv in ([flag, "ping"], ["ping", flag]):
        r = mldiag(*argv)
        assert r.returncode == 4 and r.stdout == "", (argv, r.stdout, r.stderr)
        assert r.stderr.startswith(f"mldiag: {flag.split('=')[0]} is one of Invoke's options, "
                                   f"which mldiag does not take: "), r.stderr


SCAN_LOG_HELP = """\
Usage: mldiag scan-log [options] PATH

Classify a remote log: tracebacks, empty error messages, NaN loss, OOM, NCCL, Xid, kills.

Options:
  --path=PATH  log file on the target (or give it as the first argument: scan-log PATH)
  --lines=N    scan the last N lines (default 2000)

Common options:
  -H NAME, --host=NAME     target name, comma list or node set (gpu[01-04]); repeatable
  -g GROUP, --group=GROUP  group name from the hosts file; repeatable
  --hosts-file=FILE        the hosts file (default: the first of $MLDIAG_HOSTS_FILE, ./hosts.yaml,
                           $XDG_CONFIG_HOME/mldiag/hosts.yaml; `mldiag hosts` says which)
  --json                   print the result documents as JSON (nothing else on stdout)
  --jsonl                  print each result as one JSON line as it arrives, then a summary line
                           (JSON Lines, for pipelines; nothing else on stdout)
  --save=DIR               directory to write one JSON file per target plus summary.json
  --junit=FILE             also write a JUnit XML report to FILE (one testsuite per diagnostic, one
                           testcase per target and check), for CI test reports
  --parallel=N             targets run at once (default 32)
  --timeout=SECONDS        seconds the diagnostic may run on the target (default: hosts.yaml's, 300)
  --keep-remote            keep the remote temp dir for debugging (its path is in the result's data)
  --diff                   after the table, show only the data fields that differ from the majority
                           of targets
  --no-color               no colour (also off when NO_COLOR is set or the output is not a terminal)
  -h, --help               this help

Hosts file: the first of --hosts-file FILE, $MLDIAG_HOSTS_FILE, ./hosts.yaml,
$XDG_CONFIG_HOME/mldiag/hosts.yaml (`mldiag --help` says more).
"""


@pytest.mark.parametrize("argv", [["scan-log", "--help"], ["scan-log", "-h"], ["--help", "scan-log"],
                                  ["scan-log", "--lines", "5", "--help"]])
def test_a_tasks_help_after_its_name_shows_it_and_runs_nothing(argv):
    r = mldiag(*argv, env={"COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    assert r.stdout == SCAN_LOG_HELP


@pytest.mark.parametrize("task, usage, specs", [
    ("run-script", "Usage: mldiag run-script [options] SCRIPT | -c CODE | -  [-- ARG...]",
     ["--path=SCRIPT", "-c CODE, --code=CODE", "--arg=VALUE", "--args-json=JSON", "--put=FILE"]),
    ("runbook", "Usage: mldiag runbook [options] NAME | --list",
     ["--name=NAME", "--list ", "--param=NAME=VALUE", "--runbooks-dir=DIR", "--format=FORMAT"]),
    ("gpu-status", "Usage: mldiag gpu-status [options]", ["--kernel-log-file=FILE", "--expect-idle "]),
    ("extract-smoke", "Usage: mldiag extract-smoke [options]",
     ["--model=MODEL", "--layers=IDS", "--samples=N", "--max-tokens=N", "--dtype=DTYPE"]),
])
def test_every_task_help_names_its_values(task, usage, specs):
    r = mldiag(task, "--help", env={"COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == usage
    for spec in specs + ["-H NAME, --host=NAME", "--timeout=SECONDS", "--parallel=N",
                         "--save=DIR", "--no-color", "-h, --help"]:
        assert f"  {spec}" in r.stdout, spec
    assert "STRING" not in r.stdout


def test_inv_scan_log_help_is_refused_not_run():
    r = inv("scan-log", "--help")
    assert r.returncode == 4 and r.stdout == ""
    assert "'--help' is not a log path (help: `mldiag scan-log --help` or `inv --help scan-log`" \
        in r.stderr


@pytest.mark.parametrize("name", ["mldiag", "inv"])
def test_scan_log_takes_its_path_either_way_and_a_path_starting_with_dash(name, tmp_path):
    log = tmp_path / "-odd.log"
    log.write_text("step 1 loss=2.0\nstep 2 loss=nan\n")
    for argv in ([str(log)], ["--path", str(log)], [f"--path={log}"]):
        r = program(name)("scan-log", *argv, "-H", "local", "--json")
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert json.loads(r.stdout)[0]["status"] == "fail"
    # a value starting with '-' reaches the script's argparse as the value (--path=VALUE),
    # where it used to be "argument --path: expected one argument" (a crash)
    r = program(name)("scan-log", "--path=-odd.log", "-H", "local", "--json")
    doc = json.loads(r.stdout)[0]
    assert "expected one argument" not in r.stdout and "crashed" not in doc["summary"], doc
    assert "-odd.log" in doc["summary"], doc


# ---------------------------------------------------------------------------- --no-color

def test_colour_on_a_terminal_only():
    with_colour = _screen("ping", "-H", "local")
    assert "\x1b[32m" in with_colour, with_colour
    assert "\x1b[" not in _screen("ping", "-H", "local", "--no-color")
    assert "\x1b[" not in _screen("ping", "-H", "local", env={"NO_COLOR": "1"})
    r = mldiag("ping", "-H", "local")
    assert r.returncode == 0 and "\x1b" not in r.stdout + r.stderr and "ok" in r.stdout


def _screen(*argv, env=None):
    from tests.terminal import mldiag_screen
    with mldiag_screen(*argv, env=env) as screen:
        assert screen.wait_exit(120) == 0, screen.text()
        return screen.text(escapes=True)


# ---------------------------------------------------------------------------- the task parser

PARSE_CASES = [
    ["mldiag", "gpu-status", "-H", "a,b", "--json"],
    ["mldiag", "ping", "gpu-status", "-H", "local"],          # two tasks on one line
    ["mldiag", "ping", "-H", "gpu-status"],                    # a task's name as a flag's value
    ["mldiag", "run-script", "ping", "-H", "local"],           # ... and as a positional
    ["mldiag", "scan-log", "--path=/var/log/x", "-H", "h", "--lines", "5"],
    ["mldiag", "--help=gpu-status"],
    ["mldiag", "--help", "node-check"],
    ["mldiag", "gpu-stats"],
    ["mldiag", "hosts", "--nope"],
    ["mldiag", "gpu-status", "-H"],
]


def _parse(program_class, argv):
    from diagnostics import __version__
    from diagnostics.cli.tasks import ns
    program = program_class(namespace=ns, version=__version__, name="mldiag", binary="mldiag")
    try:
        program.create_config()
        program.parse_core(argv)
        program.parse_collection()
        program.parse_tasks()
        program.parse_cleanup()                       # --help TASK looks its context up here
    except BaseException as exc:                      # Invoke's ParseError, our Exit(4), help's Exit
        return type(exc).__name__, str(exc), getattr(exc, "code", None)
    return (program.args.help.value,
            [(c.name, {k: a.value for k, a in c.args.items()}, [a.value for a in c.positional_args])
             for c in program.tasks])


@pytest.mark.parametrize("argv", PARSE_CASES, ids=lambda a: " ".join(a[1:]))
def test_the_parser_of_the_named_tasks_parses_as_invokes_parser_of_all(argv):
    """mldiag builds parser contexts only for the tasks its command line names
    (MldiagProgram._make_parser); the parse must be the one Invoke's full parser makes."""
    from invoke import Program
    from diagnostics.cli.program import MldiagProgram

    class AllContexts(MldiagProgram):
        _make_parser = Program._make_parser

    assert _parse(MldiagProgram, argv) == _parse(AllContexts, argv)


def test_the_parser_has_the_named_tasks_contexts_only():
    from diagnostics import __version__
    from diagnostics.cli.program import MldiagProgram
    from diagnostics.cli.tasks import ns
    program = MldiagProgram(namespace=ns, version=__version__, name="mldiag", binary="mldiag")
    program.create_config()
    program.parse_core(["mldiag", "gpu-status", "-H", "a"])
    program.parse_collection()
    program.parse_tasks()
    assert list(program.parser.contexts) == ["gpu-status"]

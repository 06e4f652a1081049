"""The ``mldiag`` console script: Invoke's Program over the same namespace.

Invoke exits 1 on its own parse errors (an unknown flag); here they are bad input: exit 4.

Invoke's core flags that only steer Invoke's own shell commands (``--echo``, ``--dry``,
``--warn-only``, ``--pty``, ``--hide``, ``--command-timeout``, ``--prompt-for-sudo-password``,
``--config``, ``--write-pyc``, ``--debug``, the list formats) are not mldiag's: no task runs a
command through Invoke, so each would be accepted and do nothing — or worse, read as a promise
(``-R/--dry`` is no dry run: the diagnostics would run; ``-T 5`` is no timeout: ``--timeout``
is). They are left out of the parser, so ``mldiag`` refuses them (exit 4, saying what to use
instead) and its help does not list them. ``inv`` is Invoke's own front end and keeps them.
"""

import inspect
import re
import shutil
import sys
import textwrap
from typing import List, Optional, Sequence, Tuple

from ..core.lean_imports import import_invoke

import_invoke()   # before any `import invoke`: without unittest.mock, with the installed PyYAML
from invoke import Argument, Exit, Program  # noqa: E402
from invoke.parser import ParseError, Parser, ParserContext  # noqa: E402

from .. import __version__
from . import cmdline, tasks
from ..builtin import BUILTIN, NO_TEAM_NEEDED
from ..engine import registry
from ..inventory import topology
from ..core.errors import EXIT_BAD_INPUT
from .tasks import COMMON_HELP, USAGE, metavar, ns


# Invoke words a flag given without its value as "Flag <Argument: host (H) [list]> needed value
# and was not given one!": said here with the flag as the user typed it.
_NEEDED_VALUE = re.compile(r"Flag <Argument: ([A-Za-z0-9_]+)(?: \(([^)]*)\))?[^>]*> needed value")
_UNKNOWN = re.compile(r"No idea what '(.*)' is!$", re.S)
_MISSING_POSITIONAL = re.compile(r"'([a-z-]+)' did not receive required positional arguments")

# Invoke core flags mldiag refuses (see the module docstring), each with what to use instead.
NOT_MLDIAG = {
    "command-timeout": "--timeout SECONDS bounds a diagnostic on its target",
    "config": "mldiag reads no Invoke config file; targets and settings are in the hosts file "
              "(--hosts-file FILE)",
    "debug": "set INVOKE_DEBUG=1 for Invoke's parser log",
    "dry": "there is no dry run; `mldiag hosts` shows each target's chain without connecting",
    "echo": "mldiag runs no shell commands through Invoke",
    "hide": "mldiag runs no shell commands through Invoke",
    "list-depth": "`mldiag --list` lists every task",
    "list-format": "`mldiag --list` lists every task",
    "prompt-for-sudo-password": "sudo on a target is `become: sudo` in the hosts file "
                                "(non-interactive sudo -n)",
    "pty": "mldiag runs no shell commands through Invoke",
    "warn-only": "the exit code is the worst status (0 ok, 1 warn, 2 fail, 3 error)",
    "write-pyc": "mldiag runs no shell commands through Invoke",
}
COMMON_ORDER = ("host", "group", "hosts-file", "json", "jsonl", "save", "junit", "parallel",
                "timeout", "keep-remote", "diff", "no-color")
HELP_FLAGS = ("-h", "--help")


def parse_error_message(exc: ParseError, refused: Sequence[Tuple[str, str]] = ()) -> str:
    text = str(exc)
    found = _NEEDED_VALUE.search(text)
    if found:
        name, short = found.group(1).replace("_", "-").strip("-"), found.group(2)
        flags = f"--{name}" + (f" (-{short})" if short and len(short) == 1 else "")
        return f"mldiag: {flags} needs a value"
    unknown = _UNKNOWN.search(text)
    if unknown:
        for spelling, name in refused:
            if unknown.group(1) == spelling or unknown.group(1).startswith(spelling + "="):
                return (f"mldiag: {spelling} is one of Invoke's options, which mldiag does not "
                        f"take: {NOT_MLDIAG[name]}")
    missing = _MISSING_POSITIONAL.search(text)
    if missing and missing.group(1) in USAGE:
        task = missing.group(1)
        return f"mldiag: {text} (usage: mldiag {task} [options] {USAGE[task]})"
    return f"mldiag: {text}"


DIAGNOSTICS_DIR_HELP = ("a directory of your own diagnostics (NAME.py files; repeatable; after "
                        "the hosts file's diagnostics:)")


class MldiagProgram(Program):
    team_problems: Tuple = ()

    def core_args(self):
        return [a for a in super().core_args() if a.name not in NOT_MLDIAG] + [
            Argument(names=("diagnostics-dir",), kind=list, help=DIAGNOSTICS_DIR_HELP)]

    def parse_collection(self) -> None:
        """The built-in tasks, and a team's diagnostics unless the command line names a task that
        needs none (``builtin.NO_TEAM_NEEDED``): ``--list``, ``--help``, ``runbook`` and any other name
        read the hosts file's ``diagnostics:``, each ``--diagnostics-dir`` and the installed
        ``mldiag.diagnostics`` packages (``team.discover``). A team file that is not a diagnostic
        mldiag can run is bad input when its task is named (exit 4, its file and line)."""
        super().parse_collection()
        word = self.core.unparsed[0] if self.core.unparsed else None
        dirs = self.args["diagnostics-dir"].value or []
        registry.use(BUILTIN)
        if word in NO_TEAM_NEEDED and not dirs:
            return
        from ..engine import team
        found = team.discover(BUILTIN, cmdline.hosts_file_in(self.core.unparsed), dirs)
        registry.use(found)
        self.collection = self.scoped_collection = tasks.collection(found)
        self.team_problems = found.problems
        problem = found.problem_of(word) if word else None
        if problem is not None:
            raise Exit(f"mldiag: {registry.unknown(word)}", code=EXIT_BAD_INPUT)

    def _refused_core(self):
        return [a for a in super().core_args() if a.name in NOT_MLDIAG]

    @property
    def args(self):
        """The parsed core flags, with Invoke's refused ones present at their defaults (Invoke's
        own steps read them by name)."""
        parsed = self.core[0].args
        for argument in self._refused_core():
            if argument.name not in parsed:
                parsed[argument.name] = argument
        return parsed

    def refused_spellings(self) -> List[Tuple[str, str]]:
        return [(("--" if len(n) > 1 else "-") + n, a.name)
                for a in self._refused_core() for n in a.names]

    def parse_core(self, argv):
        # Invoke turns bytecode writing off here (its --write-pyc keeps a user's tasks.py from
        # leaving a __pycache__ in their project). mldiag's tasks are an installed package:
        # Python's own setting stands. Off, nothing imported later (paramiko, cryptography,
        # mldiag's lazy modules) ever got a .pyc where none was installed: under a
        # PYTHONPYCACHEPREFIX every run compiled 121 modules again (~0.1 s of CPU here).
        dont_write_bytecode = sys.dont_write_bytecode
        try:
            super().parse_core(argv)
        except ParseError as exc:
            raise Exit(parse_error_message(exc, self.refused_spellings()), code=EXIT_BAD_INPUT)
        finally:
            sys.dont_write_bytecode = dont_write_bytecode
        tasks.COMMAND_LINE = list(self.argv)

    def _make_parser(self):
        """Invoke's parser with a context for each task the command line names (any token, or
        the value after a token's ``=``: ``--help=gpu-status``), not for all eleven: Invoke
        builds every task's context and then deep-copies them all on each parse, ~5 ms of every
        run before its first connection. A token that is a task name always finds its context,
        so the parse is the one Invoke makes. ``--complete`` needs them all."""
        if self.args.complete.value:
            return super()._make_parser()
        words = set(self.argv) | {token.partition("=")[2] for token in self.argv}
        ignore_unknown_help = self.config.tasks.ignore_unknown_help
        return Parser(initial=self.initial_context, contexts=[   # Collection.to_contexts, filtered
            ParserContext(name=primary, aliases=aliases, args=self.collection[primary].get_arguments(
                ignore_unknown_help=ignore_unknown_help))
            for primary, aliases in self.collection.task_names.items()
            if primary in words or words.intersection(aliases)])

    def parse_tasks(self):
        try:
            super().parse_tasks()
        except ParseError as exc:
            raise Exit(parse_error_message(exc, self.refused_spellings()), code=EXIT_BAD_INPUT)
        # `mldiag scan-log --help`: Invoke fills a missing positional before it looks at the
        # core flags, so the task would run with the path "--help"
        for context in self.tasks:
            if any(a.value in HELP_FLAGS for a in context.positional_args):
                self.args.help.value = context.name

    # ------------------------------------------------------------------------------ help

    def print_help(self) -> None:
        print(root_help(self.collection), end="")

    def list_tasks(self) -> None:
        """The tasks; then each team file that is not a diagnostic mldiag can run, on stderr
        with exit 4 (as ``runbook --list`` says of a broken runbook file)."""
        print("Tasks:\n" + _rows([(n, _first_line(self.collection[n]))
                                  for n in self.collection.tasks]), end="")
        if self.team_problems:
            sys.stdout.flush()
            raise Exit("".join(f"mldiag: {p}\n" for p in self.team_problems).rstrip("\n"),
                       code=EXIT_BAD_INPUT)

    def print_task_help(self, name: str) -> None:
        print(task_help(name, self.collection[name], self.parser.contexts[name]), end="")


def _width() -> int:
    return max(60, min(shutil.get_terminal_size((80, 24)).columns, 100))


def _rows(rows: Sequence[Tuple[str, str]], indent: int = 2) -> str:
    """Two columns: the flag or name, then its help wrapped beside it (on the next line when
    the name is too wide)."""
    width = _width()
    column = min(max(len(name) for name, _ in rows), 26) + indent + 2
    out = []
    for name, text in rows:
        lines = textwrap.wrap(text, width - column) or [""]
        if len(name) + indent + 2 > column:
            out.append(" " * indent + name)
        else:
            first = lines.pop(0)
            out.append((" " * indent + name).ljust(column) + first)
        out.extend(" " * column + line for line in lines)
    return "\n".join(line.rstrip() for line in out) + "\n"


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, _width(), initial_indent=indent, subsequent_indent=indent) + "\n"


def flag_spec(task_name: str, arg: str, takes_value: bool, short: Optional[str]) -> str:
    """``-H NAME, --host=NAME``; ``--json``."""
    flag = arg.strip("_").replace("_", "-")
    if not takes_value:
        return (f"-{short}, " if short else "") + f"--{flag}"
    value = metavar(task_name, flag)
    return (f"-{short} {value}, " if short else "") + f"--{flag}={value}"


def _first_line(task) -> str:
    doc = inspect.getdoc(task) or ""
    return doc.splitlines()[0] if doc else ""


def common_rows(task_name: str = "", names: Sequence[str] = COMMON_ORDER,
                helps: Optional[dict] = None) -> List[Tuple[str, str]]:
    helps = helps or COMMON_HELP
    takes_value = {"host", "group", "hosts-file", "save", "junit", "parallel", "timeout"}
    return [(flag_spec(task_name, n, n in takes_value, tasks.SHORT_FLAGS.get(n)), helps[n])
            for n in COMMON_ORDER if n in names]


HOSTS_FILE_HELP = """\
The hosts file names the targets and how to reach them; mldiag reads the first it finds of
  1. --hosts-file FILE
  2. $MLDIAG_HOSTS_FILE
  3. ./hosts.yaml (in the current directory)
  4. $XDG_CONFIG_HOME/mldiag/hosts.yaml (~/.config/mldiag/hosts.yaml when that is unset)
"""


def root_help(collection) -> str:
    names = list(collection.tasks)   # as ns lists them: hosts, ping, gpu-status, ...
    origin = topology.find_hosts_file()
    parts = [
        "Usage: mldiag TASK [options]   run TASK on the targets -H/-g name (else on\n"
        "                               the hosts file's defaults.targets)\n"
        "       mldiag TASK --help      TASK's own options\n"
        "       mldiag --help | --version | --list\n\n",
        _wrap("Runs prewritten diagnostics on ML machines (this one, SSH hosts, hosts behind a "
              "jump host, containers on them, Slurm nodes) inside the right Python, and prints "
              "one result per target."),
        "\nTasks:\n",
        _rows([(n, _first_line(collection[n])) for n in names]),
        "\nCommon options (every task):\n",
        _rows(common_rows()),
        "\n", HOSTS_FILE_HELP,
        _wrap("With none of them, the only target is 'local' (this machine). Without -H/-g a "
              "task runs on the file's defaults.targets (default: local). `mldiag hosts` lists "
              "the targets and names the file it read."),
        f"Here and now: {origin.describe()}\n",   # unwrapped: a path is never cut
        "\nExit codes: 0 ok, 1 warn, 2 fail, 3 error (a target could not be checked), 4 bad "
        "input, 130 interrupted.\n",
        "\nOther options:\n",
        _rows([("-h [TASK], --help[=TASK]", "this help, or TASK's (the same as mldiag TASK "
                                            "--help)"),
               ("-V, --version", "mldiag's version"),
               ("-l, --list", "the tasks and what each answers"),
               ("--diagnostics-dir=DIR", DIAGNOSTICS_DIR_HELP),
               ("--print-completion-script=SHELL", "tab completion for bash, zsh or fish")]),
    ]
    return "".join(parts)


def task_help(name: str, task, context) -> str:
    params = list(inspect.signature(task.body).parameters.values())[1:]
    own, common = [], []
    for param in params:
        flag = param.name.strip("_").replace("_", "-")
        argument = context.args.get(flag) or context.args.get(param.name)
        text = (argument.help if argument is not None else "") or ""
        if flag in COMMON_HELP:
            common.append(flag)
            continue
        spec = flag_spec(name, param.name, not isinstance(param.default, bool),
                         tasks.SHORT_FLAGS.get(param.name))
        own.append((spec, text))
    helps = {f: (context.args[f].help if f in context.args else "") or COMMON_HELP[f]
             for f in common}
    usage = f"Usage: mldiag {name} [options]" + (f" {USAGE[name]}" if name in USAGE else "")
    doc = inspect.getdoc(task) or ""
    parts = [usage + "\n\n", "".join(_wrap(p.replace("\n", " ")) + "\n"
                                     for p in doc.split("\n\n") if p.strip())]
    if own:
        parts += ["Options:\n", _rows(own), "\n"]
    parts += ["Common options:\n",
              _rows(common_rows(name, common, helps) + [("-h, --help", "this help")])]
    if "hosts-file" in common:
        parts.append("\n" + _wrap("Hosts file: the first of --hosts-file FILE, "
                                  "$MLDIAG_HOSTS_FILE, ./hosts.yaml, $XDG_CONFIG_HOME/mldiag/"
                                  "hosts.yaml (`mldiag --help` says more)."))
    return "".join(parts)


program = MldiagProgram(namespace=ns, version=__version__, name="mldiag", binary="mldiag")


def main():
    program.run()

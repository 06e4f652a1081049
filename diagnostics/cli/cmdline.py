"""The raw command line against what Invoke's parser made of it (no Invoke import here).

Invoke reads a token that is one of the task's own flags (``--json``, ``-H``) as that flag even
where the user meant it as a value: ``--arg=--json`` becomes ``--arg`` (no value) plus
``--json``, and a repeatable flag seen before raises no error, so the value vanishes and the
run changes. Only the raw argv shows what was written; ``lost_values`` compares the two.

Invoke also splits the command line at the first ``--`` (its "remainder", kept only as a
space-joined string); ``split_remainder`` gives the tokens after it exactly as they came.
"""

from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

DOUBLE_DASH = "--"


def split_remainder(argv: Sequence[str]) -> Tuple[List[str], Optional[List[str]]]:
    """``argv`` (without the program name) → (what Invoke parses, the tokens after the first
    ``--`` or None when there is no ``--``): the same split Invoke makes, tokens kept whole."""
    argv = list(argv)
    if DOUBLE_DASH not in argv:
        return argv, None
    at = argv.index(DOUBLE_DASH)
    return argv[:at], argv[at + 1:]


@dataclass(frozen=True)
class Flag:
    """One task flag as the command line spells it: ``--arg`` (and its short name, if any)."""
    name: str                    # dash name: ``args-json``
    short: Optional[str] = None  # one letter: ``H``
    takes_value: bool = True
    repeatable: bool = False

    @property
    def spellings(self) -> Tuple[str, ...]:
        return (f"--{self.name}",) + ((f"-{self.short}",) if self.short else ())


def task_segment(body: Sequence[str], task_names: Sequence[str]) -> Optional[List[str]]:
    """The tokens after the task's name in ``body`` (None when the name is not there: the task
    was not started from this command line, e.g. called in a test)."""
    body = list(body)
    for i, token in enumerate(body):
        if token in task_names:
            return body[i + 1:]
    return None


def written_values(segment: Sequence[str], flag: Flag,
                   flags: Sequence[Flag]) -> List[Optional[str]]:
    """Each value the user wrote for ``flag`` in ``segment``, in order: ``--arg V``,
    ``--arg=V``, ``-H V``, ``-H=V``, ``-HV``; None for a flag given last with nothing after it.
    The values of the task's other value flags are stepped over, as Invoke does."""
    values: List[Optional[str]] = []
    by_spelling: Dict[str, Flag] = {s: f for f in flags if f.takes_value for s in f.spellings}
    i = 0
    while i < len(segment):
        token = segment[i]
        name, eq, glued = token.partition("=")
        owner = by_spelling.get(name if eq else token)
        if owner is None and not eq and len(token) > 2 and token[0] == "-" and token[1] != "-":
            owner = by_spelling.get(token[:2])   # -Hvalue
            if owner is not None:
                eq, glued = "=", token[2:]
        if owner is None:
            i += 1
            continue
        if eq:
            value: Optional[str] = glued
            i += 1
        else:
            value = segment[i + 1] if i + 1 < len(segment) else None
            i += 2
        if owner == flag:
            values.append(value)
    return values


def lost_values(written: Sequence[Optional[str]], given: Sequence[str]) -> List[Optional[str]]:
    """What was written but never reached the task (None: a flag with no value at all)."""
    missing = Counter(written)
    missing.subtract(Counter(given))
    return [value for value in dict.fromkeys(written) if missing[value] > 0]


def hosts_file_in(argv: Sequence[str]) -> Optional[str]:
    """The last ``--hosts-file FILE`` (or ``=FILE``) of a command line, before any ``--``: the
    hosts file is read for its ``diagnostics:`` before the task name is known."""
    found = None
    words = list(argv)
    for i, word in enumerate(words):
        if word == "--":
            break
        if word == "--hosts-file" and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith("--hosts-file="):
            found = word[len("--hosts-file="):]
    return found


def first_word(argv: Sequence[str], takes_value: Sequence[str]) -> Optional[str]:
    """The first word of a command line that is neither a flag nor a flag's value (the task
    name, as Invoke's parser finds it after its core flags); ``takes_value``: the spellings of
    the flags before it that take a value as the next word (``-r DIR``)."""
    words = iter(argv)
    for word in words:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word
        if word in takes_value:
            next(words, None)
    return None

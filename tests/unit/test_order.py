"""One status, level and action order (core/results.py), client and remote alike.

The remote scripts stand alone on a target and cannot import the package, so each keeps a copy
of the orders it needs; every copy is read here with ``ast`` (core/literals.py: the scripts are
never imported) and held against core/results.py, and a new copy that is not listed here fails
too. The client has no copy left: its modules rank through core/results.py's functions.
"""

import re
from pathlib import Path

import pytest

from diagnostics.core import literals
from diagnostics.core.paths import SCRIPTS_DIR
from diagnostics.core.results import (ACTIONS, LEVELS, STATUSES, Result, action_rank, exit_code,
                                      known_status, level_rank, status_rank, worst_of_actions,
                                      worst_status)

PACKAGE = Path(SCRIPTS_DIR).parent
# script → its copies of the orders, by constant name: the scripts' shared helper, which every
# diagnostic imports, and the runtime (which runs before any file of the job is written)
REMOTE_COPIES = {
    "_remote.py": ("STATUSES", "LEVEL_RANK", "STATUS_EXIT", "ACTIONS"),
    "_runtime.py": ("STATUSES",),
}
# How a copy of an order is spelt: the action list, a level-to-rank table, the status list.
COPY_SHAPES = (re.compile(r'"none", "monitor", "app"'), re.compile(r'"warn": 1, "fail": 2'),
               re.compile(r'"ok", "warn", "fail", "error"'))


@pytest.mark.parametrize("script, name", [(s, n) for s, names in REMOTE_COPIES.items() for n in names])
def test_each_remote_copy_is_the_clients_order(script, name):
    value = literals.read_constants(str(Path(SCRIPTS_DIR) / script))[name]
    if name == "ACTIONS":
        assert tuple(value) == ACTIONS
    elif name == "STATUSES":
        assert tuple(value) == STATUSES
    elif name == "STATUS_EXIT":   # the exit code of a script run by hand
        assert value == {s: exit_code([Result("d", "t", s, "")]) for s in STATUSES}
    else:   # a level → rank table: each entry ranks as core ranks it
        assert set(value) <= set(LEVELS) | set(STATUSES)
        assert {level: level_rank(level) for level in value} == value


def test_no_other_module_keeps_a_copy_of_an_order():
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if any(shape.search(text) for shape in COPY_SHAPES):
            found.add(path.relative_to(PACKAGE).as_posix())
    expected = {f"scripts/{s}" for s in REMOTE_COPIES} | {"core/results.py"}
    assert found == expected


def test_the_rules_for_what_is_not_known():
    """An unknown status or level is an error (never hidden); an unknown action is no action
    (never a drain)."""
    assert [status_rank(s) for s in STATUSES] == [0, 1, 2, 3]
    assert status_rank("weird") == status_rank(["x"]) == status_rank(None) == 3
    assert known_status("weird") == "error" and known_status("warn") == "warn"
    assert [level_rank(lv) for lv in LEVELS] == [0, 1, 2] and level_rank("ok") == 0
    assert level_rank("\x1b[31m") == level_rank(["lvl"]) == 3
    assert [action_rank(a) for a in ACTIONS] == list(range(len(ACTIONS)))
    assert action_rank("explode") == action_rank(None) == action_rank(7) == -1
    assert worst_of_actions(["monitor", "explode", "drain", None]) == "drain"
    assert worst_of_actions(["explode", None]) is None
    assert worst_status(["ok", "weird", "fail"]) == "error"

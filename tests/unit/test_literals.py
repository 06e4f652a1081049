"""diagnostics/core/literals.py: a file's literal values read with ast, never run."""

import ast
import os

import pytest

from diagnostics import builtin
from diagnostics.core import literals
from diagnostics.engine import registry


def constants(source):
    return literals.module_constants(ast.parse(source))


def test_literal_values_and_names_bound_before_them():
    got = constants("A = 1\nB = -2.5\nC = 'x' + 'y'\nD = 'n=%d' % A\nE = [A, (None, True)]\n"
                    "F = {1: 120.0, 'k': E}\nG = A\n")
    assert got == {"A": 1, "B": -2.5, "C": "xy", "D": "n=1", "E": (1, (None, True)),
                   "F": {1: 120.0, "k": (1, (None, True))}, "G": 1}


@pytest.mark.parametrize("source", ["X = f()\n", "X = {**base}\n", "X = -'a'\n", "X = 1 + 2\n",
                                    "X = unknown\n", "X = 'a' % (1, 2)\n", "X = -True\n",
                                    "X = 1\nX = f()\n"])
def test_anything_else_is_not_a_literal(source):
    assert "X" not in constants(source)


def test_dcgm_levels_are_read_from_the_script_that_runs_them(tmp_path):
    assert builtin.dcgm_level_timeouts() == {1: 120.0, 2: 600.0, 3: 3600.0, 4: 14400.0}
    script = tmp_path / "ran.py"
    marker = tmp_path / "marker"
    script.write_text(f"open({str(marker)!r}, 'w').close()\nLEVEL = 3\n")
    assert literals.read_constants(str(script)) == {"LEVEL": 3}
    assert not os.path.exists(marker)

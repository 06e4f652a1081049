"""A Python file's literal values, read with ``ast``: the file is never imported or run.

What counts as written literally: strings, numbers, booleans and None; tuples, lists (both read
as tuples) and dicts of them; ``-NUMBER``; ``+`` between strings and ``"..." % VALUES``; and
names bound earlier at the top of the module to such values. A team's diagnostic file is read
this way on the client (team.py), and so is a value mldiag's own remote scripts keep for
themselves that the client needs too (registry.py: dcgm.py's run-level timeouts), so that each
is written once, in the script that runs on the target.
"""

import ast
from typing import Any, Dict


class NotLiteral(Exception):
    """A value that is not written literally."""


def literal(node: ast.AST, names: Dict[str, Any]) -> Any:
    """The value ``node`` is written as; ``names``: the module's constants bound before it."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(literal(item, names) for item in node.elts)
    if isinstance(node, ast.Dict) and all(key is not None for key in node.keys):
        return {literal(key, names): literal(value, names)
                for key, value in zip(node.keys, node.values)}
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = literal(node.operand, names)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left, right = literal(node.left, names), literal(node.right, names)
        try:
            if isinstance(node.op, ast.Add) and isinstance(left, str) and isinstance(right, str):
                return left + right
            if isinstance(node.op, ast.Mod) and isinstance(left, str):
                return left % right
        except (TypeError, ValueError):
            pass
    raise NotLiteral()


def module_constants(module: ast.Module) -> Dict[str, Any]:
    """Names bound at the top of the module to a literal value (``DEFAULT_GB = 10``); a name
    bound again to something else is dropped."""
    values: Dict[str, Any] = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = literal(node.value, values)
            except NotLiteral:
                values.pop(node.targets[0].id, None)
    return values


def read_constants(path: str) -> Dict[str, Any]:
    """``module_constants`` of the Python file at ``path``."""
    with open(path, "rb") as f:
        return module_constants(ast.parse(f.read(), filename=path))

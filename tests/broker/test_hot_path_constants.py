"""The compiled QoS 0 path reads no module global that mypyc could have inlined.

mypyc inlines a module constant annotated ``Final`` (``EARLY_CHUNK: Final = 64``) into the C
code; a plain one (``EARLY_CHUNK = 64``) is looked up by name in the module's dictionary at
every use. ``Core.publish`` read ``EARLY_CHUNK`` that way once per message: ~130 of ~16,400
instructions per QoS 0 delivery, most of the QoS 0 path's loss against 66e167b
(``bench_broker_smoke.py --core-qos0`` under callgrind, docs/performance-broker.md, "The QoS 0
path against 66e167b"). This test reads the sources (ast): every name a hot function loads that
a plain assignment at its module's top level binds must be ``Final`` instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: the functions of one QoS 0 delivery (the read, the routing, the encoding, the flush):
#: module path -> qualified names
HOT = {
    "broker/core/_connection.py": ("Connection.received", "Connection.write_publish", "Connection.flush"),
    "broker/core/_core.py": ("Core.publish", "Core.deliver", "Core.flush", "Core.flush_written"),
    "broker/core/_publish.py": ("accept_publish", "deliver_accepted"),
    "broker/core/_router.py": ("Router.route",),
    "broker/protocol/_encode.py": ("PublishTemplate.__init__", "PublishTemplate.render"),
}


def _literal(value: ast.expr | None) -> bool:
    """A value mypyc inlines when it is ``Final``: a number, string or bytes literal, or
    arithmetic on them (``256 * 1024``)."""
    match value:
        case ast.Constant(value=v):
            return isinstance(v, int | float | str | bytes)
        case ast.UnaryOp(operand=operand):
            return _literal(operand)
        case ast.BinOp(left=left, right=right):
            return _literal(left) and _literal(right)
    return False


def _plain_constants(tree: ast.Module) -> set[str]:
    """Names a plain assignment (not ``Final``) of a literal binds at the module's top level."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _literal(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and _literal(node.value)
            and "Final" not in ast.unparse(node.annotation)
        ):
            names.add(node.target.id)
    return names


def _function(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    scope: list[ast.stmt] = tree.body
    *outer, name = qualname.split(".")
    for cls in outer:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls).body
    return next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.parametrize("path", sorted(HOT))
def test_hot_functions_read_only_final_module_constants(path: str) -> None:
    tree = ast.parse((ROOT / path).read_text())
    plain = _plain_constants(tree)
    found = []
    for qualname in HOT[path]:
        fn = _function(tree, qualname)
        local = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        found += [
            f"{qualname}: {n.id} (line {n.lineno})"
            for n in ast.walk(fn)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in plain and n.id not in local
        ]
    assert not found, f"module globals looked up by name on the hot path (annotate them Final): {found}"

"""The architecture's import rules, checked on the source (docs/architecture.md, "Layers").

Every ``import`` statement of the packages is read with :mod:`ast` (module level, inside
functions and under ``TYPE_CHECKING`` alike: a type-only import is still an arrow):

* a package imports only packages of its own or a lower layer (topics, content <- composite
  <- broker <- bridge, cluster);
* no import of a ``_``-module across a package boundary (docs/architecture.md, "Seams"): a
  private module is private to the package that holds it (and that package's subpackages); any
  other package imports the public module that package offers (its ``__init__.py``,
  ``broker.ext``, ``broker.packets``, ...). The few imports that still cross are listed in
  :data:`CROSSING` with the reason;
* inside a package the modules import each other without a cycle at run time (a name imported
  from a public module counts as an import of the module that defines it: the seams load their
  names lazily, and must not hide a cycle);
* inside ``broker`` a floor imports only its own or lower floors (issue 41): ``protocol`` (with its public
  face ``broker.packets``) and leaf helpers (``_logging``, ``_files``, ``_extras``) <- ``values`` (the
  values every floor passes, the flow state's one encoding) <- ``durability`` (the store) <-
  ``core`` (the sans-IO broker) <- ``net`` and the app level (``Broker``, config, CLI, hooks'
  lifecycle, security);
* the ten largest modules are reported (printed: size is a smell to look at, not a rule).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: layer of each first-party package: a package may import packages of lower layers only
LAYERS = {"topics": 0, "content": 1, "composite": 2, "broker": 3, "cluster": 4, "bridge": 4, "uplink": 4}

#: imports of a ``_``-module across a package boundary that stay, (importer, private module) ->
#: why. Everything else goes through the package's public module (docs/architecture.md, "Seams").
#: Empty since issue 41 item 2 removed the core <-> durability cycle (the shared values moved to
#: ``broker.values``) and the compiled modules import ``Record`` from ``broker.protocol``.
CROSSING: dict[tuple[str, str], str] = {}


#: floors inside ``broker`` (module name prefixes; the longest match decides; the rest: APP)
APP = 4
BROKER_FLOORS = {
    "broker.protocol": 0,
    "broker.packets": 0,
    "broker._logging": 0,
    "broker._files": 0,
    "broker._extras": 0,
    "broker.values": 1,
    "broker.durability": 2,
    "broker.core": 3,
}


def _floor(module: str) -> int:
    """The floor of a ``broker`` module (:data:`BROKER_FLOORS`; net and app level: :data:`APP`)."""
    best, floor = "", APP
    for prefix, f in BROKER_FLOORS.items():
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
            best, floor = prefix, f
    return floor


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def _parse(path: Path) -> ast.Module:
    """The syntax tree of ``path``, parsed once per run (the checks walk each module several
    times: parsing it for every name followed took ~19 s of the suite)."""
    return ast.parse(path.read_text(), str(path))


@functools.cache
def _type_only(tree: ast.Module) -> set[ast.AST]:
    """The import statements under ``if TYPE_CHECKING:`` (annotations only)."""
    out: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for sub in node.body:
                out.update(ast.walk(sub))
    return out


def _imports(path: Path, runtime_only: bool = False) -> set[str]:
    """Absolute names of the first-party modules ``path`` imports (``runtime_only``: leave
    out the imports under ``if TYPE_CHECKING:``)."""
    tree = _parse(path)
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    skip = _type_only(tree) if runtime_only else set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.add(mod)
            # ``from broker import _codec`` imports the module broker._codec
            found.update(f"{mod}.{a.name}" for a in node.names)
    return {m for m in found if m.split(".")[0] in LAYERS}


@functools.cache
def _sources() -> dict[str, Path]:
    out = {}
    for pkg in LAYERS:
        d = ROOT / pkg
        if d.is_dir():
            for path in d.rglob("*.py"):
                out[_module_name(path)] = path
    return out


def _from_module(node: ast.ImportFrom, path: Path) -> str:
    """The absolute module name of ``from ... import`` statement ``node`` in ``path``."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


@functools.cache
def _origin(module: str, name: str) -> str | None:
    """The first-party module that defines ``name`` which ``module`` offers (followed through
    the re-exports of public modules, lazy ones included: they name their sources in ``from``
    imports, under ``if TYPE_CHECKING:`` for the lazy ones). None: ``module`` defines it, or
    it is no first-party module."""
    path = _sources().get(module)
    if path is None:
        return None
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    home = _from_module(node, path)
                    if home not in _sources():
                        return None
                    return _origin(home, alias.name) or home
    return None


def _private_owner(module: str) -> str | None:
    """The package a ``_``-module is private to (``broker.core._core`` -> ``broker.core``),
    None for a public module."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_"):
            return ".".join(parts[:i])
    return None


def test_no_import_from_a_higher_layer() -> None:
    wrong = []
    for name, path in _sources().items():
        mine = LAYERS[name.split(".")[0]]
        for target in _imports(path):
            top = target.split(".")[0]
            if top != name.split(".")[0] and LAYERS[top] >= mine:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_broker_floors_import_downwards_only() -> None:
    """The core imports neither the store's users nor the app level (``broker.hooks``,
    ``broker._config``: what it needs of them is ``core._hooks`` and ``core._options``), the
    store does not import the core, the shared values import neither (type-only imports count:
    an annotation is an arrow too)."""
    wrong = []
    for name, path in _sources().items():
        if not name.startswith("broker.") or (mine := _floor(name)) == APP:
            continue
        for target in _imports(path):
            if target.split(".")[0] == "broker" and _floor(target) > mine:
                wrong.append(f"{name} (floor {mine}) imports {target} (floor {_floor(target)})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_private_module_imported_across_a_package_boundary() -> None:
    """A ``_``-module is private to its package (and the package's subpackages): every other
    package imports the public module that package offers. Tests may import private modules;
    the rule is for the product code. The imports left crossing are in :data:`CROSSING`."""
    sources = _sources()
    wrong = []
    used = set()
    for name, path in sources.items():
        mine = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target in _imports(path):
            owner = _private_owner(target)
            if target not in sources or owner is None or mine == owner or mine.startswith(owner + "."):
                continue
            if (name, target) in CROSSING:
                used.add((name, target))
            else:
                wrong.append(f"{name} imports {target} (private to {owner})")
    assert not wrong, "\n".join(sorted(wrong))
    stale = sorted(f"{a} -> {b}" for a, b in set(CROSSING) - used)
    assert not stale, "CROSSING lists imports that no longer cross: " + ", ".join(stale)


def test_no_import_cycle_inside_a_package() -> None:
    """Runtime imports only: ``Core`` and ``Connection`` are the two halves of one state
    machine and name each other in annotations (``if TYPE_CHECKING:``), which mypyc needs
    for native attribute access; such type-only arrows create no initialization order."""
    sources = _sources()
    graph: dict[str, set[str]] = {}
    for name, path in sources.items():
        pkg = name.split(".")[0]
        targets = _imports(path, runtime_only=True)
        # ``from broker.ext import Core`` imports broker.core._core (the seams are lazy)
        tree = _parse(path)
        skip = _type_only(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node not in skip:
                home = _from_module(node, path)
                targets |= {o for a in node.names if (o := _origin(home, a.name)) is not None}
        graph[name] = {
            t for t in targets if t in sources and t != name and t.split(".")[0] == pkg and t != pkg
        }
    # Tarjan-free check: depth-first search with colours, reporting one cycle
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        colour[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if colour.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in colour:
                cycle = visit(m)
                if cycle:
                    return cycle
        stack.pop()
        colour[n] = 2
        return None

    for n in sorted(graph):
        if n not in colour:
            cycle = visit(n)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_report_the_largest_modules(capsys: pytest.CaptureFixture[str]) -> None:
    """The ten largest modules, printed (``pytest -s tests/test_layers.py``): a module's size is
    a smell to look at, not a reason to move code (issue 41 replaced the 900-line cap, which had
    code split by line count instead of by concern)."""
    sizes = sorted(
        ((len(path.read_text().splitlines()), name) for name, path in _sources().items()), reverse=True
    )[:10]
    with capsys.disabled():
        print("\nlargest modules (lines):")
        for n, name in sizes:
            print(f"  {n:6,d}  {name}")
    assert len(sizes) == 10 and all(n > 0 for n, _ in sizes)

"""The import graph of src/pydist: layers import only downward (DESIGN.md), and modules do
not import each other in a circle. For the layers every import counts, inside functions and
in ``if TYPE_CHECKING:`` blocks too (an annotation that names a higher layer is an upward
import all the same); the cycles are those of the imports that run (two modules of one
package may name each other's types in annotations)."""
from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"

#: Lazy re-exports of a higher layer by the public package, on attribute access only:
#: ``pydist.DistributedDataParallel`` (pydist/__init__.__getattr__) needs torch.
ALLOWED = {("pydist", "pydist.torch.ddp")}


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


#: The layers, lowest first: a package imports only packages of lower tiers ("pydist": the
#: package itself, the public API's re-exports; "_torch_autoload": torch's entry point).
TIERS = [
    {"core"},
    {"net", "device"},
    {"store"},
    {"rendezvous", "transport"},
    {"algorithms", "debug", "run"},
    {"engines"},
    {"groups"},
    {"api"},
    {"pydist"},
    {"torch", "data"},
    {"testing", "examples"},
    {"bench"},
    {"_torch_autoload"},
]
TIER = {package: tier for tier, packages in enumerate(TIERS) for package in packages}


def _imports(tree: ast.AST, annotations: bool = True):
    """Every import statement, in function bodies too; in ``if TYPE_CHECKING:`` blocks only
    with ``annotations``."""
    if not annotations:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
                node.body = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def import_graph(annotations: bool = True) -> dict[str, set[str]]:
    """{module: the pydist modules it imports} (``from . import x`` counts x, not the package);
    ``annotations``: with the imports of ``if TYPE_CHECKING:`` blocks."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, package) in modules.items():
        edges = set()
        for node in _imports(ast.parse(path.read_text()), annotations):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names}
                continue
            base = name.split(".") if package else name.split(".")[:-1]
            if node.level:
                base = base[:len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            subs = {f"{prefix}.{alias.name}" for alias in node.names} & modules.keys()
            edges |= subs
            if len(subs) < len(node.names):
                edges.add(prefix)
        graph[name] = {e for e in edges if e in modules and e != name and (name, e) not in ALLOWED}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package(module: str) -> str:
    """The layer of ``module``: its folder under pydist, or the module itself at the top
    ("pydist": the package's ``__init__``)."""
    return module.split(".")[1] if "." in module else module


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module from a layer that is not below its own (same package aside)."""
    found = []
    for module, targets in sorted(graph.items()):
        mine = package(module)
        for target in sorted(targets):
            theirs = package(target)
            if theirs != mine and TIER[theirs] >= TIER[mine]:
                found.append(f"{module} -> {target}")
    return found


def test_every_package_has_a_layer():
    assert {package(module) for module in _modules()} <= TIER.keys()


def test_layers_import_only_downward():
    found = upward(import_graph())
    assert not found, "imports of a layer not below the importer's:\n" + "\n".join(found)


def test_the_checker_sees_an_upward_import_under_type_checking():
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..api import groups\n"
    def modules(annotations: bool) -> list[str | None]:
        return [node.module for node in _imports(ast.parse(source), annotations) if isinstance(node, ast.ImportFrom)]
    assert modules(annotations=True) == ["typing", "api"] and modules(annotations=False) == ["typing"]
    assert upward({"pydist.engines.native": {"pydist.groups.state"}, "pydist.groups.state": {"pydist.core.errors"}}) \
        == ["pydist.engines.native -> pydist.groups.state"]


def test_no_import_cycles():
    graph = import_graph(annotations=False)
    found = cycles(graph)
    described = ["; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a] & set(c))) for c in found]
    assert not found, "import cycles:\n" + "\n".join(described)


def test_the_checker_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

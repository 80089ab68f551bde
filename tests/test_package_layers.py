"""The import graph of src/pydist has no cycles (imports inside functions included, TYPE_CHECKING
blocks not): layers import only downward (DESIGN.md)."""
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


def _imports(tree: ast.AST):
    """Every import statement, skipping ``if TYPE_CHECKING:`` blocks."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def import_graph() -> dict[str, set[str]]:
    """{module: the pydist modules it imports} (``from . import x`` counts x, not the package)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, package) in modules.items():
        edges = set()
        for node in _imports(ast.parse(path.read_text())):
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


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    described = ["; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a] & set(c))) for c in found]
    assert not found, "import cycles:\n" + "\n".join(described)


def test_the_checker_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

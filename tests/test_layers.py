"""The package's imports follow the data flow one way: a module imports only from its own layer's
package or from layers below it, and no import cycle exists (lazy imports inside functions
included). The order is written once, here."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_ncclx"

# Lowest first: a layer may import from the layers before it, never after.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "log_setup", "layout", "files", "exit_status"),
    ("config",),
    ("backend",),
    ("analysis",),
    ("report",),
    ("dump",),
    ("events",),
    ("alerts",),
    ("watchdog", "straggler"),
    ("metrics",),
    ("strategies", "hydra_store"),
    ("registration", "cli", "zero_code", "zero_code_callback", "__init__"),
]


def _layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("lightning_ncclx"):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("lightning_ncclx"))
    return found


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_imports_from_a_higher_layer() -> None:
    upward = []
    for module, imported in _graph().items():
        if module == "lightning_ncclx":
            continue
        for target in imported:
            if target != "lightning_ncclx" and _layer_of(target) > _layer_of(module):
                upward.append(f"{module} -> {target}")
    assert upward == [], "imports that run back up the data flow:\n" + "\n".join(sorted(upward))


def test_no_import_cycle() -> None:
    graph = _graph()
    modules = set(graph)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = {m: {t for t in (resolve(x) for x in targets) if t and t != m} for m, targets in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)
    # the package face re-exports lazily; a package __init__ importing its own submodules is no cycle
    real = [c for c in cycles if not all(m.count(".") <= 1 and c[0].startswith(m) for m in c[:1])]
    assert real == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in real)

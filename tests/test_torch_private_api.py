"""torch's private distributed API is called from one module only, ``backend/torch_api.py``: when
torch changes a private call, that module is the one place to look. Every other module of the
package, the benches, scripts and examples is read (AST) for imports of private torch.distributed
modules or names, attribute access to underscored members of them, process-group internals
(``_get_backend``, ``_device_types``, ``_world.pg_map``...), torch's private backend classes and
the NCCL version query."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from lightning_ncclx.backend import torch_api

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("lightning_ncclx", "bench", "scripts", "examples", "hydra_plugins")
THE_MODULE = "lightning_ncclx/backend/torch_api.py"

TEMPORARY_ALLOWLIST: frozenset[str] = frozenset()

PRIVATE_ROOTS = ("torch.distributed", "torch._C")
# Members of process groups, backends and torch's group table that only torch_api may touch.
PRIVATE_MEMBERS = frozenset({
    "_get_backend", "_get_backend_name", "_device_types", "_set_default_backend", "_register_backend",
    "_set_group_desc", "_set_default_timeout", "_add_ephemeral_timeout",
    "pg_map", "pg_group_ranks", "pg_names", "pg_flight_recorder_hooks",
})
# torch.distributed's private functions and table, however the module was reached.
PRIVATE_FUNCTIONS = frozenset({
    "_get_default_store", "_get_default_group", "_set_pg_timeout", "_rank_not_in_group", "_world",
    "_dump_fr_trace", "_dump_fr_trace_json", "_dump_fr_trace_file", "_dump_nccl_trace", "_dump_nccl_trace_json",
    "_reset_fr_trace", "_maybe_attach_flight_recorder", "_get_process_group_name",
})
PRIVATE_CLASSES = frozenset({"ProcessGroupNCCL2", "ProcessGroupNCCLLazy", "FlightRecorderHook"})
NCCL_VERSION_MODULE = "torch.cuda.nccl"


def _is_private_module(module: str) -> bool:
    parts = module.split(".")
    if module.startswith("torch._C._distributed"):
        return True
    return module.startswith("torch.distributed") and any(p.startswith("_") for p in parts[2:])


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local names bound to torch modules: ``dist`` -> ``torch.distributed``..."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" or alias.name.startswith("torch."):
                    found[alias.asname or "torch"] = alias.name if alias.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch"):
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def private_calls(source: str) -> list[str]:
    """``"<line>: <what>"`` for every use of torch's private distributed API in ``source``."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    hits: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            hits.update((node.lineno, f"import {a.name}") for a in node.names if _is_private_module(a.name))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PRIVATE_ROOTS):
            for alias in node.names:
                if _is_private_module(node.module) or alias.name.startswith("_"):
                    hits.add((node.lineno, f"from {node.module} import {alias.name}"))
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node, aliases)
            if dotted is not None and (
                (dotted.startswith(PRIVATE_ROOTS) and any(p.startswith("_") for p in dotted.split(".")[2:]))
                or dotted.startswith("torch._C._distributed")
                or dotted.startswith(NCCL_VERSION_MODULE)
            ):
                hits.add((node.lineno, dotted))
            elif node.attr in PRIVATE_MEMBERS or node.attr in PRIVATE_CLASSES:
                hits.add((node.lineno, f".{node.attr}"))
            elif node.attr in PRIVATE_FUNCTIONS and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                hits.add((node.lineno, f".{node.attr}"))
            elif node.attr == "_timeout" and isinstance(node.value, ast.Attribute) and node.value.attr == "options":
                hits.add((node.lineno, ".options._timeout"))
        elif isinstance(node, ast.Constant) and node.value in PRIVATE_MEMBERS | PRIVATE_CLASSES:
            hits.add((node.lineno, repr(node.value)))  # getattr / hasattr with the member's name
    return [f"{line}: {what}" for line, what in sorted(hits)]


def _scanned_files() -> list[str]:
    files = []
    for folder in SCANNED:
        files.extend(str(p.relative_to(ROOT)) for p in sorted((ROOT / folder).rglob("*.py")))
    return files


def test_no_module_but_torch_api_calls_torchs_private_distributed_api() -> None:
    found = []
    for relative in _scanned_files():
        if relative == THE_MODULE or relative in TEMPORARY_ALLOWLIST:
            continue
        found.extend(f"{relative}:{hit}" for hit in private_calls((ROOT / relative).read_text()))
    assert found == [], "call these through lightning_ncclx.backend.torch_api:\n" + "\n".join(found)


def test_torch_api_itself_is_found_calling_it() -> None:
    """The scan sees what torch_api does; an empty answer would mean a blind scan."""
    hits = private_calls((ROOT / THE_MODULE).read_text())
    for expected in ("_get_default_store", "pg_map", "_get_backend", "_dump_fr_trace_json", "ProcessGroupNCCL2",
                     "torch.cuda.nccl", "_set_pg_timeout", "options._timeout"):
        assert any(expected in hit for hit in hits), (expected, hits)


@pytest.mark.parametrize("source", [
    "import torch._C._distributed_c10d",
    "from torch._C import _distributed_c10d as c\nc._dump_fr_trace(True, True, False)",
    "import torch\ntorch._C._distributed_c10d._dump_nccl_trace()",
    "from torch.distributed.distributed_c10d import _get_default_store",
    "from torch.distributed import distributed_c10d as c10d\nc10d._world",
    "import torch.distributed as dist\ndist.distributed_c10d._get_default_group()",
    "def f(pg, device):\n    return pg._get_backend(device)",
    "def f(pg):\n    return hasattr(pg, '_get_backend')",
    "def f(world):\n    return list(world.pg_group_ranks.items())",
    "def f(backend):\n    return backend.options._timeout",
    "import torch\nhasattr(torch._C, 'ProcessGroupNCCL2')",
    "import torch\ntorch.cuda.nccl.version()",
    "from torch.distributed._composable import replicate",
    "import importlib\nimportlib.import_module('torch.distributed.distributed_c10d')._get_default_store()",
])
def test_each_kind_of_private_call_is_found(source: str) -> None:
    assert private_calls(source) != []


@pytest.mark.parametrize("source", [
    "import torch.distributed as dist\ndist.all_reduce(t)\ndist.is_initialized()",
    "from torch.distributed import PrefixStore, TCPStore",
    "class Ranks:\n    def size(self):\n        return self._world",  # an object's own underscored field
    "def f(strategy):\n    return strategy._timeout",  # Lightning's attribute, not torch's
    "import torch\ntorch.cuda._sleep(10)",  # private, but not distributed
    "message = 'builds ProcessGroupNCCL2 here'",
])
def test_public_calls_and_unrelated_names_are_not_found(source: str) -> None:
    assert private_calls(source) == []


def test_every_public_function_of_torch_api_names_the_torch_versions_it_was_checked_on() -> None:
    functions = [f for name, f in inspect.getmembers(torch_api, inspect.isfunction)
                 if not name.startswith("_") and f.__module__ == torch_api.__name__]
    assert len(functions) >= 10
    for function in functions:
        doc = inspect.getdoc(function) or ""
        assert "Checked on:" in doc and "2.15.0" in doc, function.__name__

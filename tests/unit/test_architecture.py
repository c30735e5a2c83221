"""Import direction: no import circle anywhere in the package (lazy imports inside functions included), and the layering cuts hold."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# import name of each source tree (setup.py's package_dir)
ROOTS = {"qkvqa": REPO / "src" / "qkvqa", "qkvqa.data_modules": REPO / "data_modules"}


def modules() -> dict[str, Path]:
    """Every module of the source trees by its import name."""
    found = {}
    for top, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = [*top.split("."), *path.relative_to(root).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports, at the top or inside any function."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets.add(node.module)
                targets.update(f"{node.module}.{a.name}" for a in node.names)
        graph[name] = {t for t in targets if t in mods and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert len(graph) > 100 and "qkvqa.qff.vit_cache" in graph
    assert cycles(graph) == []


def imports_of(prefix: str) -> set[str]:
    """Everything the modules under `prefix` import."""
    return {t for name, targets in import_graph().items() if name == prefix or name.startswith(prefix + ".")
            for t in targets}


def test_the_filter_stage_does_not_reach_into_stage_one_embedding():
    assert not any(t.startswith("qkvqa.retrieval.embed") for t in imports_of("qkvqa.qff"))


def test_the_data_layer_imports_neither_the_synthetic_world_nor_the_datamodules():
    assert not {t for t in imports_of("qkvqa.data") if t.startswith(("qkvqa.synth", "qkvqa.data_modules", "qkvqa.qff"))}
    assert not {t for t in imports_of("qkvqa.synth") if not t.startswith(("qkvqa.synth", "qkvqa.data", "qkvqa.errors",
                                                                           "qkvqa.utils"))}

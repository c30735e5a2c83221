"""Import direction: no import circle anywhere in the package (lazy imports inside functions included), no loop between
packages, every package imports only the layers below it (docs/ARCHITECTURE.md "Layers"), and the layering cuts hold."""

from __future__ import annotations

import ast
from functools import cache
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
    """module -> the package modules it imports, at the top or inside any function (a fresh copy for each caller)."""
    return {name: set(targets) for name, targets in _parsed_import_graph().items()}


@cache
def _parsed_import_graph() -> dict[str, set[str]]:
    """The import graph, parsed once per test process (each test used to parse every module again, about 1 s)."""
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
    return {
        t
        for name, targets in import_graph().items()
        if name == prefix or name.startswith(prefix + ".")
        for t in targets
    }


def test_the_filter_stage_does_not_reach_into_stage_one_embedding():
    assert not any(t.startswith("qkvqa.retrieval.embed") for t in imports_of("qkvqa.qff"))


def test_the_data_layer_imports_neither_the_synthetic_world_nor_the_datamodules():
    assert not {t for t in imports_of("qkvqa.data") if t.startswith(("qkvqa.synth", "qkvqa.data_modules", "qkvqa.qff"))}
    assert not {
        t
        for t in imports_of("qkvqa.synth")
        if not t.startswith(("qkvqa.synth", "qkvqa.data", "qkvqa.errors", "qkvqa.utils"))
    }


# The layers, lowest first: a package imports only packages listed before it (or itself), at the top of a file or
# inside any function. The stages keep the data flow's order (data -> retrieval -> qff -> cda -> generation ->
# pipeline -> cli); the scorers of `metrics` sit below the stages, which score their own output with them (stage 1's
# Recall@K, the QFF's section recall), and import none of them. `qkvqa` is the package's own __init__ (its version).
LAYERS = (
    "errors",
    "qkvqa",
    "utils",
    "components",
    "data",
    "synth",
    "config",  # the data layer, the synthetic world written in its formats, configs
    "metrics",  # official scorers: below every stage
    "loggers",
    "callbacks",
    "run",  # W&B and the run-record logger, callbacks, runs and the Trainer
    "retrieval",
    "qff",
    "data_modules",
    "models",  # stage 1, the filter, the DataModules (over qff's pools), QFFTrainer
    "cda",
    "generation",
    "pipeline",  # CDA, the generator, the per-question pipeline and its recipe
    # tools over runs; the sweep runner and the demo run qkvqa's commands with what the command line passes in (its
    # parser, `qkvqa.cli.sweep.compose_command`; its entry point, `qkvqa.cli.main.main`)
    "inspect",
    "doctor",
    "compare",
    "sweep",
    "demo",
    "cli",
    "__main__",
)


def package_of(module: str) -> str:
    """`qkvqa.retrieval.embed` -> `retrieval`, `qkvqa.data_modules.base` -> `data_modules`, `qkvqa` -> `qkvqa`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """package -> the other packages its modules import (function-local imports included)."""
    packages: dict[str, set[str]] = {}
    for name, targets in graph.items():
        packages.setdefault(package_of(name), set()).update(package_of(t) for t in targets)
    return {p: targets - {p} for p, targets in packages.items()}


def test_the_import_graph_counts_imports_inside_functions():
    graph = import_graph()
    # qkvqa.qff.rerank imports qkvqa.retrieval.retrieve only inside rerank_split
    assert "qkvqa.retrieval.retrieve" in graph["qkvqa.qff.rerank"]
    source = (ROOTS["qkvqa"] / "qff" / "rerank.py").read_text(encoding="utf-8")
    assert "\nfrom qkvqa.retrieval.retrieve import" not in source


def test_every_package_has_a_layer():
    assert set(package_graph(import_graph())) <= set(LAYERS)
    assert len(LAYERS) == len(set(LAYERS))


def test_no_package_imports_a_package_that_imports_it_back():
    assert cycles(package_graph(import_graph())) == []


def test_each_package_imports_only_the_layers_below_it():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted(
        f"{name} -> {t}"
        for name, targets in import_graph().items()
        for t in targets
        if rank[package_of(t)] > rank[package_of(name)]
    )
    assert upward == []


def test_the_layer_check_sees_an_upward_import():
    rank = {name: i for i, name in enumerate(LAYERS)}
    # stage 1 importing the DataModules (as retrieval.retrieve did through datamodule_for) goes up two layers
    assert rank[package_of("qkvqa.data_modules")] > rank[package_of("qkvqa.retrieval.retrieve")]
    assert cycles(
        package_graph(
            {
                "qkvqa.retrieval.retrieve": {"qkvqa.data_modules"},
                "qkvqa.data_modules": {"qkvqa.qff.mining"},
                "qkvqa.qff.mining": {"qkvqa.retrieval.retrieve"},
            }
        )
    ) == [["data_modules", "qff", "retrieval"]]


def test_the_stages_read_the_benchmark_they_are_given():
    """Only the command line, the evaluation recipe, doctor and the demo build the data from a config
    (`build_benchmark`): the stages take the benchmark, and none of them imports the DataModules."""
    graph = import_graph()
    below = [name for name in graph if package_of(name) in ("data", "retrieval", "qff", "cda", "generation", "metrics")]
    assert not [name for name in below if any(package_of(t) == "data_modules" for t in graph[name])]
    builders = {name for name, path in modules().items() if "build_benchmark(" in path.read_text(encoding="utf-8")}
    assert {package_of(name) for name in builders} <= {"data", "data_modules", "cli", "pipeline", "doctor", "demo"}
    assert {name for name in builders if package_of(name) == "pipeline"} <= {"qkvqa.pipeline.evaluate"}

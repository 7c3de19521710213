"""The layers import one way (norms -> model -> training -> variants -> lab -> scripts, notebooks, entry
points), and no module imports itself back through others. Read from the source, lazy imports included.

The papers' variants (variants/) may import norms, model and training; model and training reach a variant only
through a "module:Class" string (model/registry.py, training/step/optim.py, training/step/post_step.py), which this check
does not see as an import, and never by an import statement."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("norms", "model", "training", "variants", "lab")  # each may import only itself and those before it
TOP = ("train", "eval", "scripts", "notebooks")  # the readers' side: nothing of ours imports these


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_modules() -> dict[str, Path]:
    files = [p for layer in (*LAYERS, "scripts", "notebooks") for p in (ROOT / layer).rglob("*.py")]
    files += [ROOT / "train.py", ROOT / "eval.py"]
    return {module_name(p): p for p in files}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Our modules that ``path`` imports anywhere in it (``from lab import study`` names lab.study)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def rank(module: str) -> int:
    top = module.split(".")[0]
    return LAYERS.index(top) if top in LAYERS else len(LAYERS)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = our_modules()
    known = set(modules)
    graph = {name: imports_of(path, known) - {name} for name, path in modules.items()}
    # A package's __init__ is imported by every module inside it: that edge is no cycle of ours.
    return {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in graph.items()}


def test_every_import_goes_down_the_layers(graph):
    upward = sorted(
        f"{source} imports {target}"
        for source, targets in graph.items()
        for target in targets
        if rank(target) > rank(source) or (rank(target) == len(LAYERS) and rank(source) < len(LAYERS))
    )
    assert not upward, "imports against norms -> model -> training -> variants -> lab -> scripts:\n" + "\n".join(upward)


def test_every_layer_is_read(graph):
    """Each layer's modules are in the graph (variants/ included), so no layer escapes the checks above."""
    for layer in LAYERS:
        assert any(name == layer or name.startswith(layer + ".") for name in graph), layer
    assert {"variants.qk_clip", "variants.muon", "variants.ngpt", "variants.hybridnorm"} <= set(graph)


def test_the_core_imports_no_variant(graph):
    """model and training name a variant only by its import path (a string), never by an import statement."""
    core = sorted(
        f"{source} imports {target}"
        for source, targets in graph.items()
        if source.split(".")[0] in ("norms", "model", "training")
        for target in targets
        if target.split(".")[0] == "variants"
    )
    assert not core, "the core imports variants/:\n" + "\n".join(core)


def test_norms_import_nothing_else_of_ours(graph):
    assert not {
        t for s, targets in graph.items() if s.startswith("norms") for t in targets if not t.startswith("norms")
    }


def test_no_module_imports_itself_through_others(graph):
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_a_lazy_import_and_a_from_import(tmp_path):
    """The graph is only as good as its parser: a function-level import and ``from pkg import mod`` count."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from lab import study\n    import training.config\n")
    assert imports_of(source, {"lab", "lab.study", "training", "training.config"}) == {
        "lab",
        "lab.study",
        "training.config",
    }

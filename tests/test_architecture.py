"""The house rules of docs/architecture.md, checked on the code.

Every import of every module in ``autotune/`` and ``probes/`` is read with
``ast`` (those inside functions and ``TYPE_CHECKING`` blocks too): no import
circle, no module importing a higher layer, ``probes`` free of autotune, and
no module over the size a reader can hold.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Lowest first; a module may import its own layer or lower ones only.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("autotune._version", "autotune.errors", "autotune.files", "autotune.units", "autotune.epochs", "autotune.devices", "autotune.redact",
     "autotune.teardown", "autotune.nested", "autotune.torch_knobs", "autotune.setup_checks"),
    ("autotune.train_setup",),
    ("autotune.records", "autotune.rounds", "autotune.time_spent", "autotune.flag_terms"),
    ("autotune.workloads",),
    ("autotune.runner",),
    ("autotune.output",),
    ("autotune.tuner",),
    ("autotune.render",),
    ("autotune.cli", "autotune.cli_errors", "autotune.cli_options", "autotune.api", "autotune.__main__", "autotune"),
)
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in ("autotune", "probes"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = _package_of(name, path).split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    best = (-1, -1)  # (length of the matching prefix, layer)
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), index))
    if best[1] < 0:
        raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: add it")
    return best[1]


def test_every_autotune_module_has_a_layer() -> None:
    for module in MODULES:
        if module.startswith("autotune"):
            _layer(module)


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
        for module, targets in GRAPH.items()
        if module.startswith("autotune")
        for target in targets
        if target.startswith("autotune") and _layer(target) > _layer(module)
    ]
    assert not upward, "\n".join(upward)


def test_probes_knows_nothing_of_autotune() -> None:
    leaks = [f"{m} imports {t}" for m, targets in GRAPH.items() if m.startswith("probes") for t in targets if t.startswith("autotune")]
    assert not leaks, leaks


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(GRAPH.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle() -> None:
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_circle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(GRAPH, "autotune.records", GRAPH["autotune.records"] | {"autotune.tuner.run"})
    assert _cycle() is not None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_readable(name: str) -> None:
    lines = MODULES[name].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)} has {lines} lines; split it"

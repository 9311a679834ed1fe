"""The import direction of the library's layers, read from the source.

Every import statement of ``redist/`` and ``partir_core/`` is an edge of a module graph: those inside
functions too, but not those under ``if TYPE_CHECKING:`` (annotations only, never run). A package being
split into modules (``redist/synthesis/``, ``redist/verify/``) is one member of its layer, whatever its
modules are called (:data:`PACKAGES`). The tests pin:

- no cycle among library modules (no module imports another that imports it back, directly or not);
- every import of a redist module goes to its own layer or one below (:data:`LAYERS`, from the bottom up;
  the same table in words is in ``redist/__init__.py``'s docstring), and every redist module has a layer,
  so that a new module must be placed;
- the verifier proves a lowered program against the types' own semantics: nothing under ``redist.verify``
  imports the steps' typing rules, the block geometry they rest on, or the synthesizer (:data:`UNTRUSTED`);
- partir_core reaches redist through redist's vocabulary and public namespace (:data:`VOCABULARY`), and
  beyond them only through :data:`BRIDGE`; no redist module imports partir_core;
- no library module imports bench, proofs or tests.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from tests import ROOT

LIBRARY = ("redist", "partir_core")
OUTSIDE = ("bench", "proofs", "tests")  # never imported by the library
# Packages whose modules count as one member of a layer (split into modules while the table stands).
PACKAGES = ("redist.synthesis", "redist.verify")

# redist's layers, from the bottom up: a module imports only from its own layer and those below it.
LAYERS = (
    ("vocabulary", {"redist.errors", "redist.extras", "redist.axes", "redist.mesh", "redist.types", "redist.blocks",
                    "redist.buffers", "redist.data", "redist.picture"}),
    ("steps", {"redist.steps", "redist.bounds", "redist.program", "redist.lowering"}),
    ("plans", {"redist.plan", "redist.plan_file", "redist.plan_picture", "redist.plot"}),
    # the cost model prices plans and steps; the synthesizer ranks its candidates with it
    ("cost", {"redist.cost"}),
    ("search and proof", {"redist.synthesis", "redist.verify"}),
    ("runtimes", {"redist.execute", "redist.backends", "redist.backends.interpreter", "redist.backends.numpy_backend",
                  "redist.backends.jax_backend", "redist.backends.mpi_backend", "redist.backends.mpi_channels",
                  "redist.backends.mpi_placement", "redist.backends.mpi_transfers", "redist.backends.mpi_reductions",
                  "redist.backends.jax_stages", "redist.backends.mpi_stages",
                  "redist.hlo", "redist.xla_log", "redist.jax_programs", "redist.jax", "redist.mpi"}),
    # redist.show reads a JAX array's type through redist.jax, below it
    ("public namespace", {"redist", "redist.show"}),
    # front ends and instruments on top of the library, which no library module needs: the command line, the
    # demo, random inputs for tests and benchmarks, XLA's own redistribution compiled for comparison
    ("tools", {"redist.cli", "redist.__main__", "redist.demo", "redist.testing", "redist.xla_baseline"}),
)
UNTRUSTED = ("redist.steps", "redist.blocks", "redist.synthesis")
VOCABULARY = {"redist", "redist.errors", "redist.extras", "redist.axes", "redist.mesh", "redist.types",
              "redist.picture"}
BRIDGE = {
    "partir_core.reshard": {"redist.steps", "redist.bounds", "redist.jax"},  # plans for its reshards, run on JAX
    "partir_core.simulator": {"redist.cost"},  # collectives priced by redist's cost model
    # the proof of a partitioned program rests on redist's verifier: its reshards proved, its deadline and verdict
    "partir_core.proof": {"redist.verify"},
    "partir_core.proof.invariant": {"redist.verify"},
    "partir_core.proof.verdict": {"redist.verify"},
}


@dataclass(frozen=True)
class Import:
    """``module`` (in ``path``, line ``line``) imports ``target``: a module of the library if it names one, else the
    name as written (``from redist import Plan`` imports ``redist``)."""

    module: str
    target: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.target}"


def member(module: str) -> str:
    """The layer member ``module`` belongs to: its package in :data:`PACKAGES`, else itself."""
    return next((p for p in PACKAGES if module == p or module.startswith(p + ".")), module)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def library_modules() -> dict[str, Path]:
    """Every module of the library by name (a package by its ``__init__.py``)."""
    return {_module_name(p): p for top in LIBRARY for p in sorted((ROOT / top).rglob("*.py"))}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Reader(ast.NodeVisitor):
    """The imports of one module, wherever they stand, but those under ``if TYPE_CHECKING:``."""

    def __init__(self, module: str, path: Path):
        self.module, self.path = module, str(path.relative_to(ROOT))
        self.package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        self.found: list[Import] = []

    def visit_If(self, node: ast.If) -> None:
        for child in (node.orelse if _type_checking(node.test) else node.body + node.orelse):
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            anchor = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:
            name = f"{base}.{alias.name}"
            self._add(name if name in library_modules() else base, node)

    def _add(self, target: str, node: ast.stmt) -> None:
        found = Import(self.module, target, self.path, node.lineno)
        if found not in self.found:  # ``from m import a, b`` of names that are no modules: one import of m
            self.found.append(found)


@lru_cache(maxsize=None)
def imports() -> tuple[Import, ...]:
    """Every import of every library module, in file and line order."""
    found = []
    for module, path in library_modules().items():
        reader = _Reader(module, path)
        reader.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        found += reader.found
    return tuple(found)


def _within(prefix: str, module: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _library_edges() -> list[Import]:
    """The imports from one library module of another (a module importing itself left out)."""
    modules = library_modules()
    return [i for i in imports() if i.target in modules and i.target != i.module]


def _layer_of() -> dict[str, tuple[int, str]]:
    return {m: (rank, name) for rank, (name, members) in enumerate(LAYERS) for m in members}


def _graph(edges: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.module, set()).add(e.target)
    return graph


def _cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    graph = _graph(edges)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


# ---------------------------------------------------------------------------------------------- tests
def test_the_source_is_read():
    """The graph is not empty by accident: the reader finds the imports every layer is known to make."""
    found = {(i.module, i.target) for i in imports()}
    assert ("redist.plan", "redist.plan_file") in found
    assert ("redist.jax_programs", "redist.hlo") in found
    assert ("partir_core.reshard", "redist.jax") in found
    # an import inside a function counts; one under TYPE_CHECKING does not
    assert ("redist.execute", "redist.backends.jax_backend") in found
    assert ("redist.blocks", "redist.types") not in found


def _loop(edges: list[Import], component: list[str]) -> list[Import]:
    """A shortest loop of imports through the first module of ``component`` (modules that import one another),
    found breadth first within it: the imports that make it, in order."""
    graph, start = _graph(edges), component[0]
    parent: dict[str, str] = {}
    queue = deque([start])
    while start not in parent:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w in component and w not in parent:
                parent[w] = v
                queue.append(w)
    path, v = [start], parent[start]
    while v != start:
        path.append(v)
        v = parent[v]
    path = [start] + path[::-1]
    return [next(e for e in edges if (e.module, e.target) == hop) for hop in zip(path, path[1:])]


def test_no_import_cycles():
    edges = _library_edges()
    problems = []
    for component in _cycles(edges):
        loop = _loop(edges, component)
        problems.append(f"{len(component)} modules import one another in a loop ({', '.join(component)}), e.g. "
                        + " -> ".join([loop[0].module] + [e.target for e in loop]) + ":\n    "
                        + "\n    ".join(str(e) for e in loop))
    assert not problems, "\n".join(problems)


def test_every_redist_module_has_a_layer():
    placed = _layer_of()
    members = {member(m) for m in library_modules() if _within("redist", m)}
    unplaced = sorted(members - set(placed))
    assert not unplaced, (f"redist modules with no layer: {', '.join(unplaced)}; place each in LAYERS in "
                          "tests/project/test_layers.py (and in the layers paragraph of redist/__init__.py's docstring)")
    stale = sorted(set(placed) - members)
    assert not stale, f"LAYERS names modules that do not exist: {', '.join(stale)}"


def test_imports_go_down_the_layers():
    layer = _layer_of()
    problems = []
    for e in _library_edges():
        src, dst = member(e.module), member(e.target)
        if not (_within("redist", src) and _within("redist", dst)) or src not in layer or dst not in layer:
            continue
        (rank_src, name_src), (rank_dst, name_dst) = layer[src], layer[dst]
        if rank_dst > rank_src:
            problems.append(f"{e}: {src} is in layer {name_src!r}, {dst} in {name_dst!r} above it (a module "
                            "imports only from its own layer and those below it)")
    assert not problems, "\n".join(problems)


def test_the_verifier_imports_no_steps_blocks_or_synthesis():
    problems = [f"{e}: the verifier must not depend on what it checks (nothing under redist.verify imports "
                f"{', '.join(UNTRUSTED)})"
                for e in imports() if member(e.module) == "redist.verify" and member(e.target) in UNTRUSTED]
    assert not problems, "\n".join(problems)


def test_partir_core_reaches_redist_through_its_bridge_only():
    problems, used = [], set()
    for e in imports():
        if not (_within("partir_core", e.module) and _within("redist", e.target)):
            continue
        target = member(e.target)
        if target in VOCABULARY:
            continue
        if target in BRIDGE.get(e.module, ()):
            used.add((e.module, target))
        else:
            bridge = "; ".join(f"{m} -> {', '.join(sorted(ts))}" for m, ts in BRIDGE.items())
            problems.append(f"{e}: partir_core reaches redist through {', '.join(sorted(VOCABULARY))} and its "
                            f"bridge ({bridge}) only")
    assert not problems, "\n".join(problems)
    unused = sorted(f"{m} -> {t}" for m, ts in BRIDGE.items() for t in ts if (m, t) not in used)
    assert not unused, f"BRIDGE names imports that partir_core no longer makes: {', '.join(unused)}"


def test_redist_imports_no_partir_core():
    problems = [f"{e}: redist is the lower library and never imports partir_core"
                for e in imports() if _within("redist", e.module) and _within("partir_core", e.target)]
    assert not problems, "\n".join(problems)


def test_the_library_imports_no_bench_proofs_or_tests():
    problems = [f"{e}: the library never imports {', '.join(OUTSIDE)}"
                for e in imports() if any(_within(top, e.target) for top in OUTSIDE)]
    assert not problems, "\n".join(problems)

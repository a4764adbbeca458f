"""The package's layers, kept by its import graph.

Every module of the package (the top-level `__init__.py`, `tails.py` and `__main__.py`, `dsl/`,
`interpreter/**` and `examples/**`) is parsed with `ast`; each import is an edge of a networkx graph,
wherever it is written (at the top, inside a function, under `if TYPE_CHECKING:`, or a literal
`importlib.import_module("...")`). The rules, each reported as `file:line: rule: what`:

* `cycle`: no import cycle between modules;
* `layer`: a module imports only modules of its own layer or of the layers below it (`LAYERS`, lowest
  first), so the core never imports the tails in `examples/` (they register through entry points);
* `private`: no private name (`_x`) imported from, or read as an attribute of, another module;
* `forbidden`: the layers that run without torch (`NO_TORCH`) do not import it.

docs/architecture.md has a row for every module of the language, plans, views, bench and CLI layers,
and each row lists every module of the package that module imports ("may import").

The package facade (`duplexcadence/__init__.py`) is the one importer exempt from the rules: its public
names are imported on first use from its `_EXPORTS` table (PEP 562). Importing a name through the
facade counts as importing the module its `_EXPORTS` table names.

`python tests/architecture/test_layers.py OUT.svg` draws the layers and the imports between them
(docs/diagrams/layers.svg, written by scripts/render_diagrams.sh).
"""

from __future__ import annotations

import ast
import html
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "duplexcadence"
SOURCES = ("__init__.py", "tails.py", "__main__.py", "dsl", "interpreter", "examples")
FACADE = PACKAGE


@attrs.frozen
class Layer:
    name: str
    packages: tuple[str, ...]  # these modules and every module under them
    owns: str  # one line for the diagram and docs/architecture.md
    modules: tuple[str, ...] = ()  # these modules only (not what is under them)


# Lowest first: a module may import its own layer and the layers below it, never one above.
LAYERS = (
    Layer(
        "facade",
        (),
        "the facade: __version__, and the public names imported on first use (_EXPORTS)",
        modules=(PACKAGE, f"{PACKAGE}.interpreter"),
    ),
    Layer("language", (f"{PACKAGE}.dsl",), "parse, resolve, checks, diagnostics, the formatter"),
    Layer("plans", (f"{PACKAGE}.interpreter.plans",), "the passes: clocks, trace, allocation, arena, capture"),
    Layer("views", (f"{PACKAGE}.interpreter.views",), "graphviz drawings of a plan, by name"),
    Layer("runtime", (f"{PACKAGE}.interpreter.runtime",), "torch: arena, binding, capture and replay, verify"),
    Layer(
        "bench and serving",
        (
            f"{PACKAGE}.interpreter.engine",  # whole conversations: the runtime's tails and batched AR stages
            f"{PACKAGE}.interpreter.bench",
            f"{PACKAGE}.interpreter.serve",
            f"{PACKAGE}.interpreter.draft",  # runs a stock loop under torch; imports the language only
            f"{PACKAGE}.interpreter.tails",
            f"{PACKAGE}.tails",
        ),
        "the conversation engine, the bench, serving, dsl draft's recorder, the tail registry",
    ),
    Layer(
        "CLI and tools",
        (
            f"{PACKAGE}.interpreter.cli",
            f"{PACKAGE}.interpreter.lsp",  # the language server: imports the language and plans only
            f"{PACKAGE}.__main__",
        ),
        "the dsl command and the language server",
    ),
    Layer("tails", (f"{PACKAGE}.examples",), "the model tails (entry-point plugins) and the demo"),
)

# Layers that must start without torch (dsl check, fmt, plan and render run without it).
NO_TORCH = ("language", "plans", "views")

# Violations the test tolerates: (importing file, private name) used across modules, and import cycles as
# the set of modules in the cycle. An entry that no longer occurs fails the test.
PRIVATE_ALLOWLIST: set[tuple[str, str]] = set()
CYCLE_ALLOWLIST: set[frozenset[str]] = set()


# --- the import graph ----------------------------------------------------------------------------


@attrs.frozen
class Import:
    """One name an import statement brings from a module of the package."""

    file: str  # relative to the repository root
    line: int
    source: str  # the importing module
    target: str  # the imported module
    name: str | None = None  # the name taken from it (`from target import name`), if any


@attrs.frozen
class Violation:
    file: str
    line: int
    rule: str
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.rule}: {self.text}"


def module_files() -> dict[str, Path]:
    """Module name -> file, for every module of the package."""
    files: list[Path] = []
    for source in SOURCES:
        path = ROOT / source
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    modules = {}
    for path in files:
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = module_files()


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def known_module(dotted: str) -> str | None:
    """The module of the package `dotted` names, or the deepest package above it."""
    parts = dotted.split(".")
    while parts:
        name = ".".join(parts)
        if name in MODULES:
            return name
        parts.pop()
    return None


def facade_exports() -> dict[str, str]:
    tree = ast.parse(MODULES[FACADE].read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("duplexcadence/__init__.py has no _EXPORTS table")


EXPORTS = facade_exports()


def absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, tree: ast.Module) -> Iterator[Import]:
    file = relative(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = known_module(alias.name)
                if alias.name.startswith(PACKAGE) and target is not None:
                    yield Import(file, node.lineno, module, target)
        elif isinstance(node, ast.ImportFrom):
            origin = absolute(module, path, node)
            if not (origin == PACKAGE or origin.startswith(PACKAGE + ".")):
                continue
            for alias in node.names:
                if f"{origin}.{alias.name}" in MODULES:  # `from package import module`
                    yield Import(file, node.lineno, module, f"{origin}.{alias.name}")
                elif origin == FACADE and alias.name in EXPORTS:  # through the facade: its source
                    yield Import(file, node.lineno, module, EXPORTS[alias.name], alias.name)
                elif (target := known_module(origin)) is not None:
                    yield Import(file, node.lineno, module, target, alias.name)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith(PACKAGE + ".")
            and (target := known_module(node.args[0].value)) is not None
        ):
            yield Import(file, node.lineno, module, target)


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_attributes(module: str, path: Path, tree: ast.Module) -> Iterator[Violation]:
    """`module._x` where `module` is a name bound to another module of the package by an import."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in MODULES:
                    bound[alias.asname] = alias.name
                elif not alias.asname and alias.name.startswith(PACKAGE):
                    bound[alias.name.partition(".")[0]] = alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            origin = absolute(module, path, node)
            for alias in node.names:
                if f"{origin}.{alias.name}" in MODULES:
                    bound[alias.asname or alias.name] = f"{origin}.{alias.name}"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and private(node.attr)):
            continue
        chain: list[str] = []
        value: ast.expr = node.value
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if not isinstance(value, ast.Name) or value.id not in bound:
            continue
        owner = ".".join([bound[value.id], *chain])
        if owner in MODULES and owner != module:
            yield Violation(relative(path), node.lineno, "private", f"{node.attr} read from {owner}")


@attrs.frozen
class Scan:
    graph: nx.DiGraph  # module -> module, each edge with its `imports` (a list of Import)
    imports: tuple[Import, ...]
    private_attributes: tuple[Violation, ...]
    torch_imports: tuple[tuple[str, int, str], ...]  # (file, line, module)


def scan(texts: dict[str, str] | None = None) -> Scan:
    """The package's import graph; `texts` replaces the source of some modules (to test the rules)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    found: list[Import] = []
    attributes: list[Violation] = []
    torch: list[tuple[str, int, str]] = []
    for module, path in MODULES.items():
        text = (texts or {}).get(module)
        tree = ast.parse(path.read_text(encoding="utf-8") if text is None else text, filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(name == "torch" or name.startswith("torch.") for name in names):
                torch.append((relative(path), node.lineno, module))
        attributes.extend(private_attributes(module, path, tree))
        if module == FACADE:  # the documented exception: the lazy `_EXPORTS` table and its TYPE_CHECKING mirror
            continue
        for edge in imports_of(module, path, tree):
            found.append(edge)
            if edge.target != module:
                if not graph.has_edge(module, edge.target):
                    graph.add_edge(module, edge.target, imports=[])
                graph.edges[module, edge.target]["imports"].append(edge)
    return Scan(graph, tuple(found), tuple(attributes), tuple(torch))


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the layer that holds `module` (the longest matching package wins)."""
    best: tuple[int, int] | None = None
    for index, layer in enumerate(LAYERS):
        if module in layer.modules:
            return index
        for package in layer.packages:
            if (module == package or module.startswith(package + ".")) and (best is None or len(package) > best[1]):
                best = (index, len(package))
    return None if best is None else best[0]


# --- the rules -----------------------------------------------------------------------------------


def cycles(scanned: Scan, allowed: set[frozenset[str]] = CYCLE_ALLOWLIST) -> list[Violation]:
    """Each module in a strongly connected component of the graph: one cycle through it, edge by edge."""
    violations = []
    for component in sorted(nx.strongly_connected_components(scanned.graph), key=sorted):
        if len(component) < 2 or component in allowed:
            continue
        cycle = nx.find_cycle(scanned.graph.subgraph(component))
        path = " -> ".join([source for source, _ in cycle] + [cycle[0][0]])
        for source, target in cycle:
            first = scanned.graph.edges[source, target]["imports"][0]
            violations.append(Violation(first.file, first.line, "cycle", f"{source} -> {target} (in {path})"))
    return violations


def upward_imports(scanned: Scan) -> list[Violation]:
    violations = []
    for edge in scanned.imports:
        source, target = layer_of(edge.source), layer_of(edge.target)
        if source is not None and target is not None and target > source:
            text = f"{LAYERS[source].name} imports {LAYERS[target].name}: {edge.source} -> {edge.target}"
            violations.append(Violation(edge.file, edge.line, "layer", text))
    return violations


def private_names(scanned: Scan) -> list[Violation]:
    violations = list(scanned.private_attributes)
    for edge in scanned.imports:
        if edge.name is not None and private(edge.name):
            violations.append(Violation(edge.file, edge.line, "private", f"{edge.name} imported from {edge.target}"))
        elif (
            private(edge.target.rpartition(".")[2]) and edge.source.rpartition(".")[0] != edge.target.rpartition(".")[0]
        ):
            violations.append(Violation(edge.file, edge.line, "private", f"{edge.target} imported from outside"))
    return violations


def torch_imports(scanned: Scan) -> list[Violation]:
    return [
        Violation(file, line, "forbidden", f"{module} imports torch ({LAYERS[layer_of(module)].name} runs without it)")
        for file, line, module in scanned.torch_imports
        if layer_of(module) is not None and LAYERS[layer_of(module)].name in NO_TORCH
    ]


def allowlisted(violation: Violation) -> bool:
    return (violation.file, violation.text.split()[0]) in PRIVATE_ALLOWLIST


def report(violations: list[Violation]) -> str:
    return f"{len(violations)} violation(s):\n" + "\n".join(map(str, sorted(violations, key=str)))


@pytest.fixture(scope="module")
def scanned() -> Scan:
    return scan()


def test_every_module_is_in_a_layer() -> None:
    missing = [relative(path) for module, path in MODULES.items() if layer_of(module) is None]
    assert not missing, f"add these to a layer of LAYERS in tests/architecture/test_layers.py: {missing}"


def test_no_import_cycles(scanned: Scan) -> None:
    violations = cycles(scanned)
    assert not violations, report(violations)


def test_imports_point_down(scanned: Scan) -> None:
    violations = upward_imports(scanned)
    assert not violations, report(violations)


def test_no_private_names_across_modules(scanned: Scan) -> None:
    violations = [v for v in private_names(scanned) if not allowlisted(v)]
    assert not violations, report(violations)


def test_the_allowlists_are_exact(scanned: Scan) -> None:
    """Each allowlisted violation still occurs (once the runtime drops one, its entry goes), and each
    is inside interpreter/runtime/."""
    found = {(v.file, v.text.split()[0]) for v in private_names(scanned)}
    stale = sorted(PRIVATE_ALLOWLIST - found)
    assert not stale, f"no longer used: delete these from PRIVATE_ALLOWLIST: {stale}"
    assert all(file.startswith("interpreter/runtime/") for file, _ in PRIVATE_ALLOWLIST)
    components = {frozenset(c) for c in nx.strongly_connected_components(scanned.graph) if len(c) > 1}
    stale_cycles = [sorted(c) for c in CYCLE_ALLOWLIST - components]
    assert not stale_cycles, f"no longer a cycle: delete these from CYCLE_ALLOWLIST: {stale_cycles}"
    runtime = f"{PACKAGE}.interpreter.runtime."
    assert all(module.startswith(runtime) for cycle in CYCLE_ALLOWLIST for module in cycle)


def test_layers_without_torch_do_not_import_it(scanned: Scan) -> None:
    violations = torch_imports(scanned)
    assert not violations, report(violations)


# --- docs/architecture.md: each module's row and what it may import -----------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
DOCUMENTED_LAYERS = ("language", "plans", "views", "bench and serving", "CLI and tools")


@attrs.frozen
class Row:
    line: int
    path: str  # from the repository root: `dsl/source.py`, `interpreter/bench/`
    allowed: tuple[str, ...] | None  # the modules (or packages) it may import; None: not checked here


def documented_rows(text: str) -> list[Row]:
    """The rows of the page's `| FOLDER | owns | may import |` tables."""
    rows: list[Row] = []
    base: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 3 and cells[1:] == ["owns", "may import"]:
            base = "" if cells[0] == "(package root)" else cells[0]
        elif not cells:
            base = None
        elif base is not None and cells[0].startswith("`"):
            path = base + cells[0].strip("`")
            names = tuple(n for n in re.findall(r"`([\w.]+)`", cells[2]) if not n.startswith("__"))
            checked = "<" not in path and not cells[2].startswith(("any layer", "exempt"))
            rows.append(Row(number, path, (names if cells[2] != "-" else ()) if checked else None))
    return rows


def resolve_documented(row: Row, name: str) -> str | None:
    folder = row.path if row.path.endswith("/") else row.path.rpartition("/")[0] + "/"
    package = ".".join([PACKAGE, *folder.strip("/").split("/")]) if folder.strip("/") else PACKAGE
    if row.path.endswith("/"):  # a package's row: names relative to the folder above it
        package = package.rpartition(".")[0]
    for candidate in (f"{package}.{name}", f"{PACKAGE}.interpreter.{name}", f"{PACKAGE}.{name}", name):
        if candidate in MODULES or any(module.startswith(candidate + ".") for module in MODULES):
            return candidate
    return None


def modules_of(row: Row) -> list[str]:
    if row.path.endswith("/"):
        return [m for m, path in MODULES.items() if relative(path).startswith(row.path)]
    return [m for m, path in MODULES.items() if relative(path) == row.path]


def page_problems(text: str, scanned: Scan) -> list[str]:
    rows = documented_rows(text)
    problems = []
    covered: set[str] = set()
    for row in rows:
        modules = modules_of(row)
        if not modules and "<" not in row.path:
            problems.append(f"docs/architecture.md:{row.line}: {row.path} is no module of the package")
        covered.update(modules)
        if row.allowed is None:
            continue
        allowed = []
        for name in row.allowed:
            resolved = resolve_documented(row, name)
            if resolved is None:
                problems.append(f"docs/architecture.md:{row.line}: `{name}` names no module")
            else:
                allowed.append(resolved)
        for source in modules:
            for _, target in scanned.graph.out_edges(source):
                inside = target in modules
                if not inside and not any(target == a or target.startswith(a + ".") for a in allowed):
                    edge = scanned.graph.edges[source, target]["imports"][0]
                    problems.append(
                        f"{edge.file}:{edge.line}: imports {target}, which the row of {row.path} "
                        f"(docs/architecture.md:{row.line}) does not list"
                    )
    for module, path in MODULES.items():  # a package's own __init__.py is covered by its folder's row, if any
        if LAYERS[layer_of(module)].name in DOCUMENTED_LAYERS and module not in covered and path.name != "__init__.py":
            problems.append(f"{relative(path)}: no row in docs/architecture.md")
    return problems


def test_architecture_page_lists_every_module_and_what_it_imports(scanned: Scan) -> None:
    problems = page_problems(ARCHITECTURE.read_text(encoding="utf-8"), scanned)
    assert not problems, "\n".join(problems)


def test_the_page_check_catches_a_missing_import_and_a_missing_row(scanned: Scan) -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    row = "| `evaluate.py` | exact expression values"
    assert row in text and "`syntax`, `printer`, `messages`, `diagnostics` |" in text
    without_printer = text.replace(
        "`syntax`, `printer`, `messages`, `diagnostics` |", "`syntax`, `messages`, `diagnostics` |"
    )
    [problem] = page_problems(without_printer, scanned)
    assert (
        problem.startswith("dsl/evaluate.py:")
        and "imports duplexcadence.dsl.printer, which the row of dsl/evaluate.py" in problem
    )
    without_row = "\n".join(line for line in text.splitlines() if not line.startswith(row))
    assert page_problems(without_row, scanned) == ["dsl/evaluate.py: no row in docs/architecture.md"]


# --- each rule catches what it is for ------------------------------------------------------------


@pytest.mark.parametrize(
    "module, code, rule, says",
    [
        (
            "duplexcadence.dsl.checks",
            "import attrs\nfrom duplexcadence.interpreter.views import style\n",
            upward_imports,
            "dsl/checks.py:2: layer: language imports views: duplexcadence.dsl.checks -> "
            "duplexcadence.interpreter.views.style",
        ),
        (
            "duplexcadence.interpreter.plans.trace",
            "def f():\n    import duplexcadence.examples.toy.model\n",
            upward_imports,
            "interpreter/plans/trace.py:2: layer: plans imports tails: duplexcadence.interpreter.plans.trace -> "
            "duplexcadence.examples.toy.model",
        ),
        (
            "duplexcadence.interpreter.views.style",
            "from duplexcadence import Runtime\n",
            upward_imports,
            "interpreter/views/style.py:1: layer: views imports runtime: duplexcadence.interpreter.views.style -> "
            "duplexcadence.interpreter.runtime.runtime",
        ),
        (
            "duplexcadence.interpreter.cli.plan",
            "from duplexcadence.interpreter.plans.plan import _x\n",
            private_names,
            "interpreter/cli/plan.py:1: private: _x imported from duplexcadence.interpreter.plans.plan",
        ),
        (
            "duplexcadence.interpreter.cli.plan",
            "from duplexcadence.dsl import messages\n\nmessages._y()\n",
            private_names,
            "interpreter/cli/plan.py:3: private: _y read from duplexcadence.dsl.messages",
        ),
        (
            "duplexcadence.interpreter.views.dataflow",
            "import torch\n",
            torch_imports,
            "interpreter/views/dataflow.py:1: forbidden: duplexcadence.interpreter.views.dataflow imports torch "
            "(views runs without it)",
        ),
        (
            "duplexcadence.dsl.source",
            "from duplexcadence.dsl.frontend import check_file\n",
            cycles,
            "dsl/source.py:1: cycle: duplexcadence.dsl.source -> duplexcadence.dsl.frontend",
        ),
    ],
)
@pytest.mark.slow
def test_a_violation_is_reported_with_its_place(module, code, rule, says) -> None:
    found = [str(v) for v in rule(scan({module: code})) if not allowlisted(v)]
    assert any(text.startswith(says) for text in found), found


# --- the picture ---------------------------------------------------------------------------------


def source_path(name: str, exact: bool) -> str:
    """Where a layer's entry lives: `interpreter/plans/` (a package and what is under it), `tails.py`."""
    path = MODULES.get(name)
    if path is None:  # a package the repository does not have yet
        return name.removeprefix(PACKAGE + ".").replace(".", "/") + "/"
    if path.name == "__init__.py" and not exact:
        return relative(path.parent) + "/"
    return relative(path)


def imports_text(graph: nx.DiGraph, index: int) -> str:
    """The layers that layer `index` imports, highest first."""
    if FACADE in LAYERS[index].modules:
        return "the public names of every layer, on first use (exempt)"
    used = {layer_of(target) for source, target in graph.edges if layer_of(source) == index}
    used.discard(index)
    return ", ".join(LAYERS[low].name for low in sorted(used, reverse=True)) or "nothing of the package"


def test_the_layers_picture_is_current(scanned: Scan) -> None:
    """docs/diagrams/layers.svg shows every layer and what it imports (bash scripts/render_diagrams.sh)."""
    svg = (ROOT / "docs" / "diagrams" / "layers.svg").read_text(encoding="utf-8").replace("&#45;", "-")
    for index, layer in enumerate(LAYERS):
        for text in (layer.name, f"imports: {imports_text(scanned.graph, index)}"):
            assert f">{html.escape(text, quote=False)}</text>" in svg, f"{text!r}: run bash scripts/render_diagrams.sh"


def layers_digraph(graph: nx.DiGraph):
    """The layers, top (the tails, the CLI) to bottom (the facade), each with the layers it imports."""
    import graphviz

    dot = graphviz.Digraph(
        "layers",
        graph_attr={
            "rankdir": "TB",
            "nodesep": "0.3",
            "ranksep": "0.25",
            "fontname": "Helvetica",
            "label": "Each layer imports only the layers below it (tests/architecture/test_layers.py)",
            "labelloc": "t",
        },
        node_attr={"shape": "box", "style": "rounded,filled", "fillcolor": "#f4f4f4", "fontname": "Helvetica"},
        edge_attr={"color": "#555555", "arrowsize": "0.7"},
    )
    for index, layer in reversed(list(enumerate(LAYERS))):
        where = ", ".join(
            [source_path(name, exact=False) for name in layer.packages]
            + [source_path(name, exact=True) for name in layer.modules]
        )
        imports = imports_text(graph, index)
        label = (
            f'<<B>{layer.name}</B><BR/><FONT POINT-SIZE="10">{where}</FONT><BR/>'
            f'<FONT POINT-SIZE="9" COLOR="#666666">{layer.owns}<BR/>imports: {imports}</FONT>>'
        )
        dot.node(f"layer{index}", label)
        if index:
            dot.edge(f"layer{index}", f"layer{index - 1}")
    return dot


if __name__ == "__main__":  # python tests/architecture/test_layers.py OUT.svg (or .dot, .png)
    out = Path(sys.argv[1])
    picture = layers_digraph(scan().graph)
    data = picture.source.encode() if out.suffix == ".dot" else picture.pipe(format=out.suffix[1:])
    out.write_bytes(data)

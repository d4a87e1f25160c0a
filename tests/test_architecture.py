"""The library's shape, checked from its source: the import graph (module-level imports and
the lazy ones inside functions) has no circle and no import running up a layer, and no file
is over 400 lines.

The graph is read with ``ast``, not by importing, so an import inside a function that no test
happens to call counts like one at the top of a module, and so does a module a lazy
``__getattr__`` loads by name (``importlib.import_module`` over a ``_LAZY`` map). Imports
under ``if TYPE_CHECKING:`` do not count (they never run). ``from package import name`` is an edge to ``package.name``
when that is a module, else to the package's ``__init__``; importing ``a.b.c`` also runs
``a/__init__`` and ``a/b/__init__``, but those implicit edges are left out: a package that
re-exports its submodules would otherwise be a circle with each of them.

That ``ludic_lab.rollouts``, the evaluators and the pipeline actor load no torch is checked by
``tests/test_rollout_engine.py::test_the_rollout_side_imports_no_torch`` (a subprocess that
imports them and reads ``sys.modules``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ludic_lab"
MAX_LINES = 400

# Files allowed past MAX_LINES, each with the reason.
LONG_FILES_ALLOWED = {
    # the sandbox harness runs inside bubblewrap as one script (python -I harness.py): it
    # cannot import a sibling module, so it stays one file
    "ludic_lab/envs/code_exec/harness.py",
}


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line`` (``lazy``: inside a function or class body)."""

    source: str
    target: str
    line: int
    lazy: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def library_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement that runs, with whether it sits inside a function or class."""

    def walk(node: ast.AST, lazy: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:  # the else branch runs
                    yield from walk(stmt, lazy)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, lazy
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef)
            yield from walk(child, inner)

    yield from walk(tree, False)


def _resolve(name: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _dynamic_targets(tree: ast.AST, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """Modules a lazy ``__getattr__`` loads by name: in a module that calls
    ``importlib.import_module``, every string naming a library module (``_LAZY`` maps), and
    ``f"ludic_lab.pkg.{name}"`` completed by any string of the module."""
    nodes = list(ast.walk(tree))
    if not any(
        isinstance(n, ast.Attribute | ast.Name) and getattr(n, "attr", getattr(n, "id", "")) == "import_module"
        for n in nodes
    ):
        return
    strings = {(n.value, n.lineno) for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    prefixes = [
        n.values[0].value
        for n in nodes
        if isinstance(n, ast.JoinedStr)
        and len(n.values) == 2
        and isinstance(n.values[0], ast.Constant)
        and isinstance(n.values[0].value, str)
        and isinstance(n.values[1], ast.FormattedValue)
    ]
    for value, line in strings:
        for candidate in [value, *(prefix + value for prefix in prefixes)]:
            if candidate in modules:
                yield candidate, line


def import_graph() -> list[Edge]:
    """Edges between library modules, one per (source, target, line)."""
    modules = library_modules()
    edges: set[Edge] = set()
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        found: list[tuple[str, int, bool]] = [(t, line, True) for t, line in _dynamic_targets(tree, modules)]
        for node, lazy in _imports(tree):
            if isinstance(node, ast.Import):
                found += [(alias.name, node.lineno, lazy) for alias in node.names]
            else:
                base = _resolve(name, path, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.append((sub if sub in modules else base, node.lineno, lazy))
        for target, line, lazy in found:
            # `import a.b.c` names a.b.c; the edge goes to the longest library module it names
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(Edge(name, target, line, lazy))
    return sorted(edges, key=lambda e: (e.source, e.target, e.line))


def circles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
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
            visit(v)
    return sorted(found)


# Layers, bottom to top: a module may import from its own layer and those below it. Entries
# are paths under ludic_lab/ (a package covers its submodules; the longest entry naming a
# module decides its layer). Every top-level module and package is named here: a new one
# fails test_the_layer_table_covers_the_library until it is placed.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "0 base: data types and helpers every layer uses (no torch)",
        [
            "types",
            "token_trace",  # TokenTrace (re-exported by types)
            "display",  # the registry of HTML views the data classes' _repr_html_ asks
            "rollout_table",
            "rollout_group",  # RolloutGroup: the rollouts of one prompt (rewards and credit build on it)
            "traces",
            "failures",
            "aio",
            "jsonl",
            "net",
            "jupyter",
            "validation",
            "extras",
            "config",  # a CLI from a config dataclass: plain dataclass reflection
            "surrogates",  # lone surrogates shown as U+FFFD before any tokenizer sees them
            "data",  # the bundled datasets' files
        ],
    ),
    (
        "1 request types: the ChatClient protocol and what a request carries",
        ["inference.client", "inference.request", "inference.chat_template", "inference.sampling"],
    ),
    ("1 rendering: messages <-> ids per model family (request types only, never a client)", ["rendering"]),
    ("1 inference backends: local, vLLM client and server, models, weight transfer", ["inference"]),
    ("1 endpoint: the OpenAI-compatible front over any ChatClient (never training)", ["endpoint"]),
    (
        "2 env / agent, and rewards that run before credit",
        ["envs", "parsers", "context", "agents", "rewards", "judges"],
    ),
    (
        "3 interaction, and the environments of other packages as ludic_lab envs, protocols and rewards",
        ["interaction", "integrations"],
    ),
    (
        "4 distribution: publishers, and starting a sampler with its publisher (imports inference, never training)",
        ["distributed", "sampler"],
    ),
    ("5a rollouts: engine, requests, credit, SAW items (no torch)", ["rollouts"]),
    ("5b training", ["training"]),
    (
        "6 tasks, the short path from an env to training, pipeline, evaluation",
        # runs.folder: RunFolder, written by training; saving: save_policy and the saving callbacks
        ["task", "env_training", "pipeline", "eval", "runs.folder", "saving"],
    ),
    (
        "7 lab and views: notebook layer, HTML and plots (lab/rollout_html, saw_html, token_html, reports)",
        ["lab", "runs"],  # runs: run folders read back, compared in a table and a plot
    ),
    (
        "8 entry points",
        [
            "",  # ludic_lab/__init__.py: the front door (run_sync, train_env on first use, the views registered)
            "cli",
            "demo",
            "demos",
            "recipes",
            "compat",  # the table of moved module paths and its import hook (imports the new paths by name)
        ],
    ),
]


def layer_of(module: str) -> int:
    """Index into LAYERS of the longest entry naming ``module`` (or a package above it)."""
    rel = module.removeprefix("ludic_lab").removeprefix(".")
    best: tuple[int, int] | None = None
    for rank, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if rel == entry or rel.startswith(entry + ".") or (entry == "" and rel == ""):
                if best is None or len(entry) > best[0]:
                    best = (len(entry), rank)
    if best is None or (best[0] == 0 and rel):
        raise KeyError(f"{module} is in no layer of tests/test_architecture.py's LAYERS")
    return best[1]


def _placed(module: str) -> bool:
    try:
        layer_of(module)
    except KeyError:
        return False
    return True


def _where(e: Edge) -> str:
    path = library_modules()[e.source].relative_to(ROOT)
    return f"{path}:{e.line}{' (lazy)' if e.lazy else ''}"


def test_no_import_circle() -> None:
    edges = import_graph()
    found = circles(edges)
    lines = []
    for component in found:
        members = set(component)
        lines.append("circle: " + " <-> ".join(component))
        lines += [
            f"    {e.source} -> {e.target}  {_where(e)}" for e in edges if e.source in members and e.target in members
        ]
    assert not found, "modules that import each other (lazy imports count):\n" + "\n".join(lines)


def test_no_import_runs_up_a_layer() -> None:
    placed = [e for e in import_graph() if _placed(e.source) and _placed(e.target)]  # the rest: next test
    bad = [
        f"{e.source} [{LAYERS[layer_of(e.source)][0].split(':')[0]}] imports {e.target} "
        f"[{LAYERS[layer_of(e.target)][0].split(':')[0]}]  {_where(e)}"
        for e in placed
        if layer_of(e.target) > layer_of(e.source)
    ]
    assert not bad, "imports that run up a layer (move the code, or the import into a higher layer):\n" + "\n".join(bad)


def test_the_layer_table_covers_the_library() -> None:
    modules = library_modules()
    unplaced = [name for name in modules if not _placed(name)]
    assert not unplaced, f"modules in no layer (add them to LAYERS): {unplaced}"
    stale = [entry for _, entries in LAYERS for entry in entries if entry and f"ludic_lab.{entry}" not in modules]
    assert not stale, f"LAYERS entries naming no module (moved or removed?): {stale}"


def test_no_library_file_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    over = {p: n for p, n in long.items() if p not in LONG_FILES_ALLOWED}
    assert not over, f"library files over {MAX_LINES} lines (split them by idea): {over}"
    assert all((ROOT / p).is_file() for p in LONG_FILES_ALLOWED), (
        f"allowed long files that are gone: {LONG_FILES_ALLOWED}"
    )


def test_the_graph_sees_lazy_and_by_name_imports() -> None:
    """The reader is not blind: a function-level import and a ``__getattr__`` map's module
    names are edges (if these were missed, the two tests above would pass on anything)."""
    edges = {(e.source, e.target): e for e in import_graph()}
    lazy = edges[("ludic_lab.lab.servers", "ludic_lab.inference.launch.server")]
    assert lazy.lazy
    assert ("ludic_lab.inference", "ludic_lab.inference.local.client") in edges  # _LAZY map
    assert ("ludic_lab.pipeline", "ludic_lab.pipeline.actor") in edges  # f"ludic_lab.pipeline.{module}"


# The reference's directory map (shared/seeds/architecture.md), under ludic_lab: a Ludic user
# finds each module where the map says, even where it only re-exports (DESIGN.md, conventions).
REFERENCE_PATHS = [
    "types",
    "envs.env",
    "envs.single_agent_env",
    "envs.dataset_qa_env",
    "envs.code_exec",
    "agents.base_agent",
    "agents.tool_agent",
    "agents.react_agent",
    "context.base",
    "context.full_dialog",
    "context.truncated_thinking",
    "interaction.base",
    "interaction.single_agent",
    "interaction.multi_agent",
    "inference.client",
    "inference.vllm_client",
    "inference.vllm_server",
    "inference.sampling",
    "training.trainer",
    "training.algorithm",
    "training.config",
    "training.checkpoint",
    "training.credit_assignment",
    "training.loss",
    "training.batching",
    "distributed.interfaces",
    "distributed.publisher",
    "eval",
    "parsers",
]


def test_the_reference_module_paths_import() -> None:
    import importlib

    missing = []
    for rel in REFERENCE_PATHS:
        try:
            importlib.import_module(f"ludic_lab.{rel}")
        except ImportError as e:
            missing.append(f"ludic_lab.{rel}: {e}")
    assert not missing, "module paths of the reference's directory map that no longer import:\n" + "\n".join(missing)
    from ludic_lab.inference import start_vllm_server, wait_for_vllm_health  # noqa: F401
    from ludic_lab.inference.sampling import SamplingConfig  # noqa: F401
    from ludic_lab.inference.vllm_client import VLLMChatClient  # noqa: F401
    from ludic_lab.inference.vllm_server import LudicServerOptions, main  # noqa: F401

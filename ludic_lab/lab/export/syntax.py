"""What a cell's syntax tree says: the names it binds and reads, its imports, its awaits.

Also the small source transformations code generation needs (indenting a body without
touching multi-line strings, ``global`` lines) and :func:`free_names` of a whole script.
"""

from __future__ import annotations

import ast
import builtins
import io
import symtable
import tokenize
from collections.abc import Iterable, Sequence

_DUNDERS = {"__name__", "__file__", "__doc__", "__builtins__", "__spec__", "__loader__", "__package__",
            "__annotations__", "__dict__"}  # fmt: skip
# Names an IPython shell adds to ``builtins`` once it exists: builtins in a kernel, undefined in
# the exported script (so a cell's bare ``display(...)`` must be reported, kernel or not).
_KERNEL_BUILTINS = {"display", "get_ipython", "__IPYTHON__", "dreload"}


def split_imports(body: str, tree: ast.Module) -> tuple[list[str], str]:
    """(the cell's top-level import statements, the cell without them). An import sharing
    a line with another statement (``import x; y = 1``) stays where it is."""
    lines = body.splitlines()
    taken: set[int] = set()
    imports = []
    spans = [(n.lineno, n.end_lineno or n.lineno) for n in tree.body]
    for n in tree.body:
        if not isinstance(n, (ast.Import, ast.ImportFrom)) or (
            isinstance(n, ast.ImportFrom) and n.module == "__future__"
        ):
            continue
        a, b = n.lineno, n.end_lineno or n.lineno
        if sum(1 for s, e in spans if s <= b and e >= a) > 1:
            continue
        imports.append(ast.get_source_segment(body, n) or ast.unparse(n))
        taken.update(range(a, b + 1))
        while b < len(lines) and not lines[b].strip():  # the blank lines after it (never inside a string)
            b += 1
            taken.add(b)
    return imports, "\n".join(ln for i, ln in enumerate(lines, 1) if i not in taken)


def has_toplevel_await(tree: ast.AST) -> bool:
    """True when ``tree`` awaits outside any function (as notebook cells may)."""
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.Await, ast.AsyncFor, ast.AsyncWith)):
            return True
        if isinstance(n, (ast.comprehension,)) and n.is_async:
            return True
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(n))
    return False


def toplevel_loads(tree: ast.AST) -> set[str]:
    """Names read when the cell runs (function bodies excluded; defaults and decorators count)."""
    out: set[str] = set()
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo += n.decorator_list + n.args.defaults + [d for d in n.args.kw_defaults if d is not None]
            continue
        if isinstance(n, ast.Lambda):
            todo += n.args.defaults + [d for d in n.args.kw_defaults if d is not None]
            continue
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.add(n.id)
        todo.extend(ast.iter_child_nodes(n))
    return out


def bound_names(tree: ast.Module) -> set[str]:
    """Names a cell binds at its top level (module scope, as in the notebook)."""
    src = ast.unparse(tree)
    table = symtable.symtable(src, "<cell>", "exec")
    return {s.get_name() for s in table.get_symbols() if binds(s) and not s.is_declared_global()} | {
        s.get_name() for t in tables(table) for s in t.get_symbols() if s.is_declared_global() and binds(s)
    }


def binds(s: symtable.Symbol) -> bool:
    return s.is_assigned() or s.is_imported() or s.is_namespace()


def tables(t: symtable.SymbolTable) -> Iterable[symtable.SymbolTable]:
    yield t
    for c in t.get_children():
        yield from tables(c)


def function_locals(body: str, is_async: bool) -> set[str]:
    """Names ``body`` binds when it runs as a function body (they are declared global in main)."""
    wrapped = ("async def _f():\n" if is_async else "def _f():\n") + indent(body or "pass")
    fn = symtable.symtable(wrapped, "<cell>", "exec").get_children()[0]
    return {s.get_name() for s in fn.get_symbols() if s.is_local() and binds(s) and not s.is_parameter()}


def indent(body: str, prefix: str = "    ") -> str:
    """Indent code without touching the inside of multi-line strings."""
    lines = body.splitlines()
    inside: set[int] = set()  # 1-based lines that start inside a multi-line token
    try:
        for tok in tokenize.generate_tokens(io.StringIO(body + "\n").readline):
            if tok.end[0] > tok.start[0]:
                inside.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return "\n".join(ln if (n in inside or not ln.strip()) else prefix + ln for n, ln in enumerate(lines, 1))


def global_lines(names: Sequence[str], width: int = 88) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    for n in names:
        if cur and len("global " + ", ".join(cur + [n])) > width - 4:
            out.append("global " + ", ".join(cur))
            cur = []
        cur.append(n)
    if cur:
        out.append("global " + ", ".join(cur))
    return out


def free_names(src: str, filename: str = "<script>") -> set[str]:
    """Names ``src`` reads as globals but never binds (builtins excluded)."""
    table = symtable.symtable(src, filename, "exec")
    bound: set[str] = set()
    used: set[str] = set()
    for t in tables(table):
        for s in t.get_symbols():
            if t is table and binds(s):
                bound.add(s.get_name())
            elif s.is_declared_global() and binds(s):
                bound.add(s.get_name())
            if s.is_referenced() and (s.is_global() or (t is table and not binds(s))):
                used.add(s.get_name())
    return used - bound - (set(dir(builtins)) - _KERNEL_BUILTINS) - _DUNDERS

"""The four packages import in a straight line: no module of allocator/, app/, workloads/ or
kvevents/ reaches itself again through the project's imports, module-level or inside a function
(a function-local import hides a circle until the function runs). Imports for type checkers only
(`if TYPE_CHECKING:`) never run and are left out; compiled modules are leaves."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("allocator", "app", "workloads", "kvevents")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "web" in path.relative_to(ROOT).parts:  # the wheel's copy of the page
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
        for path in (ROOT / pkg).rglob("*.pyx"):
            out[".".join(path.relative_to(ROOT).with_suffix("").parts)] = path
    return out


def targets(mods: dict[str, Path], name: str, node: ast.AST) -> list[str]:
    """The project modules an import statement of module `name` loads."""
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = name.split(".") if mods[name].name == "__init__.py" else name.split(".")[:-1]
            pkg = pkg[:len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    out = []
    for m in wanted:
        while m and m not in mods:
            m = m.rpartition(".")[0]
        if m and m != name:
            out.append(m)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    g: dict[str, set[str]] = {}
    for name, path in mods.items():
        g[name] = set()
        if path.suffix == ".pyx":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                g[name].update(targets(mods, name, node))
    return g


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in g:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_module_of_the_four_packages_imports_itself_back():
    g = graph()
    assert len(g) > 100 and "app.main" in g and "kvevents.fleet" in g
    assert circles(g) == []


def test_the_walk_finds_a_circle_hidden_in_a_function():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(g) == [["a", "b", "c"]]
    # and the real graph holds a function-local edge: app.runner imports workloads.live inside `build`
    assert "workloads.live" in graph()["app.runner"]

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


# -- the house rules measured from the code ------------------------------------------------------
MAX_LINES = 700  # a module past this is two concepts; the compiled cores (.pyx, .pxi) are exempt


def own_function_local_imports() -> list[tuple[str, int, str, bool]]:
    """(file, line, module, commented) of every import of the project's own modules inside a
    function of the four packages and bench/: `commented` when the line, or the one above it,
    says why it is there (a lazy load for a fast start, a circle it avoids, a missing module
    answered as an error)."""
    own = set(PACKAGES) | {"bench"}
    out = []
    for pkg in (*PACKAGES, "bench"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "web" in path.relative_to(ROOT).parts:
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            tree = ast.parse("\n".join(lines))
            seen = set()
            for fn in ast.walk(tree):
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for node in ast.walk(fn):
                    if not isinstance(node, ast.Import | ast.ImportFrom) or node.lineno in seen:
                        continue
                    seen.add(node.lineno)
                    if isinstance(node, ast.ImportFrom):
                        mod = "." * node.level + (node.module or "")
                        mine = node.level > 0 or mod.split(".")[0] in own
                    else:
                        mod = node.names[0].name
                        mine = mod.split(".")[0] in own
                    if not mine:
                        continue
                    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                    said = "#" in lines[node.lineno - 1] or above.startswith("#")
                    out.append((str(path.relative_to(ROOT)), node.lineno, mod, said))
    return out


def test_every_function_local_import_of_our_own_modules_says_why():
    found = own_function_local_imports()
    assert any(f == "app/runner.py" for f, *_ in found)  # the walk sees the one kept in app.runner
    silent = [f"{f}:{line} {mod}" for f, line, mod, said in found if not said]
    assert silent == [], "move these to the module top, or say on the line why they stay: " + ", ".join(silent)


def test_no_module_of_the_four_packages_is_past_the_line_limit():
    long = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "web" in path.relative_to(ROOT).parts:
                continue
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > MAX_LINES:
                long[str(path.relative_to(ROOT))] = n
    assert long == {}, f"split these by concept (at most {MAX_LINES} lines a module): {long}"


def test_app_state_is_read_in_the_factory_the_deps_and_the_services_only():
    readers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "app").rglob("*.py")
                     if "web" not in p.relative_to(ROOT).parts and ".state." in p.read_text(encoding="utf-8"))
    assert len(readers) <= 4 and set(readers) <= {"app/main.py", "app/deps.py", "app/services.py",
                                                   "app/http/security.py"}, readers

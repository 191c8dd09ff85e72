"""The README and the topic pages under docs/ stay true: their Python examples run as written,
every relative link and #anchor resolves, and the README stays a landing page."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", flags=re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def prose(text: str) -> str:
    """The text with fenced blocks and inline code spans removed (links there are not links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation other than `-` and
    `_` removed, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link's text stays
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub renders for the page: one per heading (repeats get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    out.update(HTML_ANCHOR.findall(page.read_text()))
    return out


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file {page_id(dest)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading in {page_id(dest)} has the anchor #{anchor}")
    return broken


def test_slug_follows_githubs_rules():
    assert slug("KV events: mirror a live vLLM / SGLang engine, publish kvscope's own") == \
        "kv-events-mirror-a-live-vllm--sglang-engine-publish-kvscopes-own"
    assert slug("Prefix caching (`allocator/prefix.py`, `allocator/_prefix.pyx`)") == \
        "prefix-caching-allocatorprefixpy-allocator_prefixpyx"
    assert slug("Bélády's MIN") == "béládys-min"


def test_broken_links_are_found(tmp_path):
    """The checker itself: a missing file and a missing anchor are both reported."""
    page = tmp_path / "p.md"
    (tmp_path / "other.md").write_text("# Other\n## A section\n## A section\n")
    page.write_text("[a](other.md#a-section-1) [b](other.md#nope) [c](missing.md) [d](#title)\n"
                    "`[e](in-code.md)`\n```\n[f](in-fence.md)\n```\n# Title\n")
    found = broken_links(page)
    assert len(found) == 2 and "#nope" in found[0] and "missing.md" in found[1], found


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_python_examples_run(page):
    """Every ```python block of the README and docs runs as written, so the documented API stays true."""
    for code in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S):
        run_as_a_script(compile(code, page_id(page), "exec"))


def run_as_a_script(code) -> None:
    """Run `code` on a thread of its own, as a user's script would run: with no event loop
    already running (the browser tests' sync Playwright keeps one on the main thread)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            exec(code, {"__name__": "docs_example"})
        except BaseException as exc:  # re-raised on the test's thread
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def test_readme_is_a_landing_page():
    text = README.read_text()
    assert "make run" in text and "make test" in text
    assert re.search(r"```python\n", text), "README.md has no python example"
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(prose(text)) if t.startswith("docs/")}
    topics = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert topics <= linked, f"topics the README does not link: {sorted(topics - linked)}"


def help_text(args: list[str]) -> str:
    """What `kvscope ARGS -h` prints, run in this process."""
    import contextlib
    import io

    from app.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main([*args, "-h"])
        except SystemExit:
            pass
    return out.getvalue()


def documented_commands(tool: str) -> list[tuple[str, str]]:
    """(page, command line) for every `tool ...` the pages show: shell lines in code blocks
    (continuation lines joined) and inline code spans."""
    found = []
    for page in PAGES:
        text = page.read_text()
        lines = []   # a console block's commands follow a `$ ` prompt, the rest is their output
        for kind, block in re.findall(r"```(bash|console|sh)\n(.*?)```", text, flags=re.S):
            lines += [line.removeprefix("$ ") for line in re.sub(r"\\\n\s*", " ", block).splitlines()
                      if kind != "console" or line.startswith("$ ")]
        lines += [s.strip("`") for s in INLINE_CODE.findall(text)]
        for line in lines:
            m = re.match(rf"\s*({re.escape(tool)}\s+.*)", line)
            if m:
                found.append((page_id(page), m.group(1).split("#")[0].strip()))
    return found


def test_documented_kvscope_commands_and_flags_exist():
    """Every `kvscope SUB --flag ...` in the README and docs names a real subcommand and flags its
    help lists (`kvscope prefix --publish` has its own help)."""
    usage = help_text([])
    commands = set(re.search(r"\{([a-z,-]+)\}", usage).group(1).split(","))
    helps: dict[tuple[str, ...], str] = {}
    wrong = []
    shown = documented_commands("kvscope")
    assert len(shown) >= 10, shown
    for page, line in shown:
        words = line.split()
        sub = words[1]
        if sub not in commands:
            wrong.append(f"{page}: {line!r}: no subcommand {sub!r}")
            continue
        key = (sub,)  # `prefix --publish` and `route --router` have helps of their own
        if sub == "prefix" and "--publish" in words:
            key = (sub, "--publish")
        elif sub == "route" and "--router" in words:
            key = (sub, "--router")
        text = helps.setdefault(key, help_text(list(key) + (["E"] if len(key) > 1 else [])))
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", line):
            if flag not in text:
                wrong.append(f"{page}: {line!r}: `kvscope {sub}` has no {flag}")
    assert not wrong, wrong


def test_documented_make_targets_and_benches_exist():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.M))
    benches = {p.stem.removeprefix("bench_") for p in (ROOT / "bench").glob("bench_*.py")}
    wrong = []
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"(?<![\w-])make ([a-z][\w-]*)", text):
            if target not in targets:
                wrong.append(f"{page_id(page)}: make {target}")
        for group in re.findall(r"python -m bench ((?:\[[^\]]*\])|[a-z]+)", text):
            for name in re.findall(r"[a-z]+", group):
                if name not in benches:
                    wrong.append(f"{page_id(page)}: python -m bench {name}")
    assert "run" in targets and "test" in targets and not wrong, wrong

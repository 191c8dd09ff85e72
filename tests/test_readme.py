"""The README's Python example runs as written, so the documented API stays true."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})


def test_readme_names_the_two_commands():
    text = README.read_text()
    assert "make run" in text and "make test" in text

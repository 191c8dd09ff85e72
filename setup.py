"""Build of kvscope's compiled allocator core (Cython) and of the page it serves. Everything else
is in pyproject.toml.

`pip install -e .` (what `make install` runs) compiles the Cython modules (MODULES) with the machine's C
compiler. Set KVSCOPE_CYTHON_DEBUG=1 for a debuggable build: bounds and wraparound checks on,
-O0 -g, line tracing, so gdb and coverage see the .pyx lines.

The dashboard's `templates/` and `static/` sit at the repository's root (where a checkout and its
editable install serve them from); a built wheel carries a copy inside the package, as
`app/web/templates` and `app/web/static`, which the server finds first (app/pages.py). The
JavaScript unit tests (static/js/tests) stay out of it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
WEB = ("templates", "static")  # copied into the package as app/web/<name>
WEB_LEFT_OUT = shutil.ignore_patterns("tests", "__pycache__", "*.pyc")

DEBUG = os.environ.get("KVSCOPE_CYTHON_DEBUG") == "1"

# Other compiled modules (e.g. allocator/_prefix.pyx, kvevents/_index.pyx) go in this list; they
# may `cimport` the primitives of allocator/_core.pxd.
MODULES = ["allocator._core", "allocator._prefix", "kvevents._index"]

extensions = [
    Extension(
        name,
        [name.replace(".", "/") + ".pyx"],
        include_dirs=[np.get_include()],
        extra_compile_args=["-O0", "-g"] if DEBUG else ["-O2"],
        define_macros=[("CYTHON_TRACE_NOGIL", "1")] if DEBUG else [],
    )
    for name in MODULES
]

directives = {"language_level": "3"}
if DEBUG:
    directives.update(boundscheck=True, wraparound=True, linetrace=True)



class build_py_with_web(build_py):
    """build_py, plus the page: templates/ and static/ copied to app/web/ in the build tree."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install serves the checkout's own copies
            return
        for name in WEB:
            src, dst = HERE / name, Path(self.build_lib) / "app" / "web" / name
            if not src.is_dir():
                raise SystemExit(f"setup.py: {src} is missing; the wheel would have no page")
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst, ignore=WEB_LEFT_OUT)


setup(ext_modules=cythonize(extensions, compiler_directives=directives),
      cmdclass={"build_py": build_py_with_web})

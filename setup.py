"""Build of kvscope's compiled allocator core (Cython). Everything else is in pyproject.toml.

`pip install -e .` (what `make install` runs) compiles allocator/_core.pyx with the machine's C
compiler. Set KVSCOPE_CYTHON_DEBUG=1 for a debuggable build: bounds and wraparound checks on,
-O0 -g, line tracing, so gdb and coverage see the .pyx lines.
"""

from __future__ import annotations

import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("KVSCOPE_CYTHON_DEBUG") == "1"

# Other compiled modules (e.g. allocator/_prefix.pyx) go in this list; they may
# `cimport` the primitives of allocator/_core.pxd.
MODULES = ["allocator._core", "allocator._prefix", "allocator._fleet"]

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

setup(ext_modules=cythonize(extensions, compiler_directives=directives))

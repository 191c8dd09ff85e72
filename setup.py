"""Build of kvscope's compiled allocator modules (Cython); metadata lives in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

EXTENSIONS = [
    Extension("allocator._prefix", ["allocator/_prefix.pyx"], extra_compile_args=["-O3"]),
]

setup(ext_modules=cythonize(EXTENSIONS, language_level=3, quiet=True))

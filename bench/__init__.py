"""kvscope benchmarks: each `bench_*.py` module has a `run()`; `python -m bench` runs them all."""

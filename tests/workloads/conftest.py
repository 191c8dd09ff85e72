import pytest

from workloads.trace import load_trace


@pytest.fixture(scope="session")
def excerpt():
    """The first 300 requests of the bundled Azure trace."""
    return load_trace(limit=300)

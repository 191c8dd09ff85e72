"""kvscope server: FastAPI over the allocator core (REST, websocket stream, metrics, page)."""

__version__ = "0.1.0"

"""Stub of vllm.config.kv_events: the fields ZmqEventPublisher passes to KVEventsConfig."""

from dataclasses import dataclass


@dataclass
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

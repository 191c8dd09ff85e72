"""Stub of vllm.logger: a standard logger (with a NullHandler, so that vLLM's own shutdown
warning, 'Queue still has 1 items', does not reach stderr through logging's last resort)."""

import logging


def init_logger(name: str) -> logging.Logger:
    log = logging.getLogger(name)
    if not log.handlers:
        log.addHandler(logging.NullHandler())
    return log

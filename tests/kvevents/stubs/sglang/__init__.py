"""Stub package (tests/kvevents/stubs/README.md). SGLang's publisher registers its shutdown with
atexit, whose 'Queue still has 1 items' warning would reach stderr after pytest is done: a
NullHandler on the package logger keeps it out of logging's last resort."""

import logging

logging.getLogger("sglang").addHandler(logging.NullHandler())

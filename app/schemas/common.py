"""What every request model shares: names and patterns, size and key types, the vocabulary's
`Literal`s, ZeroMQ endpoints, and `Strict` (the base of every request body)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from allocator.vocab import FITS, POLICIES, SCENARIOS, SOURCE_STRATEGIES, STRATEGIES, WORKLOAD_KINDS

POOL_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
# Printable: no control characters (C0, DEL, C1). '/' cannot reach a path parameter anyway.
KEY_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]{1,256}$"
MAX_BYTES = 1 << 60
MAX_TOKENS = 1 << 40

PoolName = Annotated[str, Field(pattern=POOL_NAME_PATTERN, examples=["default"])]
KEY_FIELD = Field(min_length=1, max_length=256, pattern=KEY_PATTERN, description="cache key",
                  examples=["session-1"])


def check_key(key: str) -> str:
    """The checks a pattern cannot say: printable (no unassigned or separator characters), and
    no U+FFFD, which is what invalid UTF-8 in a URL path decodes to (`%FF` and `%FE` alike)."""
    if not key.isprintable():
        raise ValueError("key must be printable characters")
    if "\ufffd" in key:
        raise ValueError("key must be valid UTF-8 without U+FFFD (invalid bytes in a path decode to it)")
    return key


# The one key type, for path parameters (app/deps.py `EntryKey`) and batch ops alike.
Key = Annotated[str, KEY_FIELD, AfterValidator(check_key)]
Bytes = Annotated[int, Field(gt=0, le=MAX_BYTES, examples=[65536])]
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS, examples=[128])]
Priority = Annotated[int, Field(ge=-(1 << 31), le=(1 << 31) - 1)]
TtlSeconds = Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)]
# The names come from the one vocabulary (allocator/vocab.py); a new entry there is accepted here.
Policy = Literal[POLICIES]
Strategy = Literal[STRATEGIES + SOURCE_STRATEGIES]
Fit = Literal[FITS]
ScenarioName = Literal[SCENARIOS]
WorkloadKind = Literal[WORKLOAD_KINDS]


def exactly_one(model: BaseModel, a: str, b: str) -> None:
    if (getattr(model, a) is None) == (getattr(model, b) is None):
        raise ValueError(f"give exactly one of '{a}' or '{b}'")


class Strict(BaseModel):
    """Request bodies: unknown fields are refused, and JSON types are not coerced ("10" is no int)."""

    model_config = ConfigDict(extra="forbid", strict=True)


# An engine's endpoint as its --kv-events-config names it: tcp:// (another host or container) or
# ipc:// (a Unix socket on this host). inproc:// reaches only sockets of this server's own
# process, where no engine publishes: refused with that reason rather than followed in silence.
ZMQ_ENDPOINT = r"^(tcp://[^\s/]+:\d{1,5}|ipc://[^\s]+)$"


def _not_inproc(endpoint):
    if isinstance(endpoint, str) and endpoint.startswith("inproc://"):
        raise ValueError(f"{endpoint!r}: inproc:// reaches only sockets inside this server's process, "
                         "where no engine publishes; give the engine's tcp:// or ipc:// endpoint")
    return endpoint


def _tcp_port(endpoint: str) -> str:
    """A tcp:// endpoint's port must be a real one (the pattern allows five digits)."""
    if endpoint.startswith("tcp://") and not 0 < int(endpoint.rsplit(":", 1)[1]) <= 65535:
        raise ValueError(f"port of {endpoint!r} is not in 1..65535")
    return endpoint


Endpoint = Annotated[str, Field(max_length=256, pattern=ZMQ_ENDPOINT, examples=["tcp://127.0.0.1:5557"]),
                     BeforeValidator(_not_inproc), AfterValidator(_tcp_port)]
Topic = Annotated[str, Field(max_length=256)]
# A publisher binds: over the API only TCP, so that a request cannot make the server create a
# socket file at a path of its choosing (ipc://).
BindEndpoint = Annotated[str, Field(max_length=256, pattern=r"^tcp://[^\s/]+:\d{1,5}$",
                                    examples=["tcp://*:5557"]), AfterValidator(_tcp_port)]

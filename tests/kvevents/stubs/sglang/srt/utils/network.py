"""Stub of sglang.srt.utils.network.NetworkAddress: host:port parsing for tcp endpoints."""

from dataclasses import dataclass


@dataclass
class NetworkAddress:
    host: str
    port: int

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.host

    @classmethod
    def parse(cls, text: str) -> "NetworkAddress":
        if text.startswith("["):
            host, _, rest = text[1:].partition("]")
            port = rest.lstrip(":")
        else:
            host, _, port = text.rpartition(":")
        try:
            return cls(host, int(port))
        except ValueError:
            raise ValueError(f"bad address {text!r}") from None

    def to_tcp(self) -> str:
        host = f"[{self.host}]" if self.is_ipv6 else self.host
        return f"tcp://{host}:{self.port}"

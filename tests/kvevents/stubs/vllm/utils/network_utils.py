"""Stub of vllm.utils.network_utils: what ZmqEventPublisher._bind needs for tcp://*:0."""

import ipaddress


def get_ip() -> str:
    return "127.0.0.1"


def is_valid_ipv6_address(address: str) -> bool:
    try:
        ipaddress.IPv6Address(address)
        return True
    except ValueError:
        return False


def get_tcp_uri(ip: str, port: int) -> str:
    return f"tcp://[{ip}]:{port}" if is_valid_ipv6_address(ip) else f"tcp://{ip}:{port}"


def split_zmq_path(path: str) -> tuple[str, str, str]:
    scheme, rest = path.split("://", 1)
    host, _, port = rest.rpartition(":")
    return scheme, host.strip("[]"), port

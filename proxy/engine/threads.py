"""CPU threads for llama.cpp: the cores this process may use, and whether an upstream runs on this machine.

A draft model whose target runs on this machine shares its cores: the two take turns
(`proxy.engine.gate`), each computing with every core while the other waits.
"""

from __future__ import annotations

import ipaddress
import os
import socket


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which taskset and containers narrow)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def is_local_host(host: str) -> bool:
    """Whether a URL's host names this machine: a loopback name or address, or an address of one of its interfaces."""
    host = host.strip("[]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return False  # unresolvable here: whatever it is, it runs elsewhere
    return any(_is_own_address(family, sockaddr[0]) for family, _, _, _, sockaddr in found)


def _is_own_address(family: socket.AddressFamily, address: str) -> bool:
    """Loopback, unspecified, or bindable: only an address of this machine's own interfaces can be bound."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.is_loopback or ip.is_unspecified:
        return True
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True

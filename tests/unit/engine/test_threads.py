"""Threads for llama.cpp: the cores this process may use, and what names this machine."""

from __future__ import annotations

import os
import socket

import pytest

from proxy.engine.threads import is_local_host, usable_cores


@pytest.mark.parametrize(("host", "local"), [
    ("localhost", True),
    ("127.0.0.1", True),
    ("127.0.1.1", True),  # all of 127/8 is loopback
    ("::1", True),
    ("[::1]", True),
    ("0.0.0.0", True),  # connecting to it reaches this machine
    (socket.gethostname(), True),
    ("192.0.2.1", False),  # TEST-NET-1: never an address of this machine
    ("2001:db8::1", False),  # the IPv6 documentation prefix
    ("upstream.invalid", False),  # unresolvable: whatever it is runs elsewhere
])
def test_which_hosts_are_this_machine(host: str, local: bool) -> None:
    assert is_local_host(host) == local


def test_usable_cores_are_the_affinity_mask() -> None:
    assert usable_cores() == len(os.sched_getaffinity(0))

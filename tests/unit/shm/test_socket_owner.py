"""engine/shm/socket_owner.py: the netlink request and reply layouts (pure), and real lookups of the user
owning the client's end of a loopback connection: this process's, another user's (a child that dropped to
`nobody`), an IPv4 client of a dual-stack listener, and a peer that is not on this machine."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys

import pytest

from engine.shm.socket_owner import NLMSG_ERROR, SOCK_DIAG_BY_FAMILY, client_uid, parse_uid, request


def test_the_request_names_the_clients_end_first():
    msg = request(socket.AF_INET, ("127.0.0.1", 40000), ("127.0.0.2", 8001), sequence=7)
    length, kind, flags, sequence, _ = struct.unpack_from("=IHHII", msg)
    assert length == len(msg) == 16 + 8 + 48 and kind == SOCK_DIAG_BY_FAMILY and flags == 1 and sequence == 7
    family, protocol = msg[16], msg[17]
    assert family == socket.AF_INET and protocol == socket.IPPROTO_TCP
    sport, dport = struct.unpack_from("!HH", msg, 24)
    assert (sport, dport) == (40000, 8001)
    assert msg[28:32] == bytes([127, 0, 0, 1]) and msg[44:48] == bytes([127, 0, 0, 2])


def test_the_uid_is_read_from_a_reply_and_an_error_reply_is_none():
    head = struct.pack("=IHHII", 16 + 72, SOCK_DIAG_BY_FAMILY, 0, 1, 0)
    reply = head + bytes(64) + struct.pack("=II", 1234, 9)  # inet_diag_msg: uid after 64 bytes, then inode
    assert parse_uid(reply) == 1234
    error = struct.pack("=IHHII", 36, NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -2) + bytes(16)  # ENOENT
    assert parse_uid(error) is None
    assert parse_uid(b"") is None and parse_uid(reply[:40]) is None


def connected(family: int = socket.AF_INET, host: str = "127.0.0.1", dual: bool = False):
    """A listener, a client connected to it, and the accepted end."""
    listener = socket.socket(family)
    if dual:
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    listener.bind((host, 0))
    listener.listen()
    client = socket.create_connection(("127.0.0.1" if dual else host, listener.getsockname()[1]))
    accepted, peer = listener.accept()
    return listener, client, accepted, peer[:2], accepted.getsockname()[:2]


@pytest.mark.parametrize("family,host,dual", [(socket.AF_INET, "127.0.0.1", False),
                                              (socket.AF_INET6, "::1", False),
                                              (socket.AF_INET6, "::", True)],
                         ids=["ipv4", "ipv6", "ipv4-client-of-a-dual-stack-listener"])
def test_the_owner_of_a_local_client_socket_is_found(family, host, dual):
    listener, client, accepted, peer, local = connected(family, host, dual)
    with listener, client, accepted:
        assert client_uid(peer, local) == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
def test_a_client_running_as_another_user_is_told_apart():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(30)
    # encodings.idna before dropping to nobody: the interpreter's own files may be out of its reach then
    code = ("import encodings.idna, os, socket, sys; os.setgid(65534); os.setuid(65534); "
            f"s = socket.create_connection(('127.0.0.1', {listener.getsockname()[1]})); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        accepted, peer = listener.accept()
        with accepted:
            assert client_uid(peer[:2], accepted.getsockname()[:2]) == 65534
    finally:
        child.communicate(timeout=10)
        listener.close()


def test_a_peer_not_on_this_machine_is_unknown():
    assert client_uid(("192.0.2.7", 50000), ("127.0.0.1", 8001)) is None  # TEST-NET-1: no such socket here
    assert client_uid(None, ("127.0.0.1", 8001)) is None
    assert client_uid(("not an address", 1), ("127.0.0.1", 8001)) is None

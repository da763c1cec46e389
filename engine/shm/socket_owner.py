"""Which local user owns the client's end of a TCP connection: `client_uid(peer, local)`, asked of the kernel
through NETLINK_SOCK_DIAG (what `ss -e` shows), for the client shared-memory owner rule
(client.py): the server opens a client's shared-memory object only if the client's own user owns
it, so a client can never reach through the server an object it could not open itself.

Only a client on this machine (in this network namespace) has its socket here: for any other the answer is
None (unknown), and so it is for a kernel without sock_diag. One exact lookup by the connection's four-tuple:
a request and a reply, microseconds, whatever the number of sockets (reading /proc/net/tcp would read all
of them). The request and reply layouts are pure functions (`request`, `parse_uid`), tested without a
kernel.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from ..access.caller import Address

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_ALL_STATES = 0xFFFFFFFF
_NO_COOKIE = 0xFFFFFFFF
# inet_diag_msg: family, state, timer, retrans (4 bytes), the socket id (48), expires, rqueue, wqueue (12),
# then uid and inode.
_UID_OFFSET = 4 + 48 + 12


def _sockid(family: int, src: Address, dst: Address) -> bytes:
    """struct inet_diag_sockid: ports big-endian, addresses in network order padded to 16 bytes, no
    interface, no cookie."""
    def addr(text: str) -> bytes:
        return socket.inet_pton(family, text).ljust(16, b"\0")

    return (struct.pack("!HH", src[1], dst[1]) + addr(src[0]) + addr(dst[0])
            + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE))


def request(family: int, src: Address, dst: Address, sequence: int = 1) -> bytes:
    """The netlink message asking for the TCP socket whose local end is `src` and remote end `dst`."""
    body = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, _ALL_STATES) + _sockid(family, src, dst)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, sequence, 0) + body


def parse_uid(reply: bytes) -> int | None:
    """The owner's uid from the kernel's reply; None for an error reply (no such socket) or a short one."""
    if len(reply) < _NLMSGHDR.size:
        return None
    length, kind, _, _, _ = _NLMSGHDR.unpack_from(reply)
    if kind != SOCK_DIAG_BY_FAMILY or len(reply) < _NLMSGHDR.size + _UID_OFFSET + 4:
        return None
    return int(struct.unpack_from("=I", reply, _NLMSGHDR.size + _UID_OFFSET)[0])


def _lookups(peer: Address, local: Address) -> list[tuple[int, Address, Address]]:
    """(family, client end, server end) to try: a v4-mapped IPv6 peer (a dual-stack listener) may be an
    IPv4 socket on the client's side, or an IPv6 one."""
    try:
        client = ipaddress.ip_address(peer[0].split("%")[0])  # without an IPv6 zone (fe80::1%eth0)
        server = ipaddress.ip_address(local[0].split("%")[0])
    except ValueError:
        return []
    if client.version == 4 and server.version == 4:
        return [(socket.AF_INET, (str(client), peer[1]), (str(server), local[1]))]
    tries: list[tuple[int, Address, Address]] = []
    if isinstance(client, ipaddress.IPv6Address) and isinstance(server, ipaddress.IPv6Address) \
            and client.ipv4_mapped is not None and server.ipv4_mapped is not None:
        mapped_client, mapped_server = str(client.ipv4_mapped), str(server.ipv4_mapped)
        tries.append((socket.AF_INET, (mapped_client, peer[1]), (mapped_server, local[1])))
    if client.version == 6 and server.version == 6:
        tries.append((socket.AF_INET6, (str(client), peer[1]), (str(server), local[1])))
    return tries


def client_uid(peer: Address | None, local: Address | None) -> int | None:
    """The uid owning the client's socket of the connection from `peer` to our `local` end, if that socket is
    on this machine; None if it is not, or the kernel cannot say."""
    if peer is None or local is None:
        return None
    for family, client, server in _lookups(peer, local):
        try:
            with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as sock:
                sock.settimeout(1.0)
                sock.sendto(request(family, client, server), (0, 0))
                uid = parse_uid(sock.recv(65536))
        except OSError:  # no netlink here (a sandbox), or no answer
            return None
        if uid is not None:
            return uid
    return None


__all__ = ["client_uid", "parse_uid", "request"]

"""A small HTTP/1.1 proxy in front of several hubserve replicas, as a Service or a gateway would be: each
request goes to the next replica in turn (round robin), unless it carries `sticky_header`: then it goes to
the replica that header's value hashes to, as the sticky rule of deploy/routing/ routes it (a request without
the header still goes round robin, as Envoy picks any replica when there is nothing to hash).

Per request, not per connection: a request is read (its head, then Content-Length bytes; a chunked request
is refused 411), sent to the chosen replica on a new connection with `Connection: close`, and the replica's
answer copied back until it closes, so the client's connection closes after every answer too (the answer
says `Connection: close`) and a keep-alive client cannot pin itself to one replica. `routed` records
(method, path, replica index) per request, for the tests to see where each went.

It runs its own event loop on a thread (`with RoundRobinProxy(...) as proxy:`), for the synchronous clients
the tests use (openai, tritonclient).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading


class RoundRobinProxy:
    def __init__(self, replicas: list[tuple[str, int]], sticky_header: str | None = None) -> None:
        self.replicas = replicas
        self.sticky_header = sticky_header.lower().encode() if sticky_header is not None else None
        self.routed: list[tuple[str, str, int]] = []
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    def __enter__(self) -> RoundRobinProxy:
        self._thread.start()
        assert self._ready.wait(10), "the proxy did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()  # stopped: connections still open (a replica yet to close one) are cut
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    def _pick(self, headers: dict[bytes, bytes]) -> int:
        key = headers.get(self.sticky_header) if self.sticky_header is not None else None
        if key:  # a stable hash, as a gateway's consistent hash on the key
            return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % len(self.replicas)
        self._next = (self._next + 1) % len(self.replicas)
        return self._next

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head[:-4].split(b"\r\n")
            headers = {}
            for line in lines:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            if b"chunked" in headers.get(b"transfer-encoding", b""):
                writer.write(b"HTTP/1.1 411 Length Required\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")
                return
            body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
            method, path, _ = request_line.decode("latin-1").split(" ", 2)
            index = self._pick(headers)
            self.routed.append((method, path, index))
            kept = [line for line in lines if not line.lower().startswith((b"connection:", b"keep-alive:"))]
            upstream_reader, upstream = await asyncio.open_connection(*self.replicas[index])
            upstream.write(b"\r\n".join([request_line, *kept, b"Connection: close", b"", b""]) + body)
            while chunk := await upstream_reader.read(1 << 16):
                writer.write(chunk)
                await writer.drain()
            upstream.close()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

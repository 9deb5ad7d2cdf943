"""The HTTP plumbing of the simulated endpoint: one-packet answers and a server that can close every connection.

:class:`RequestHandler` hands each request to its server's ``answer`` callable and writes status line, headers and
body in one ``sendall`` with ``TCP_NODELAY`` set (an answer split over packets stalls 40 ms on delayed ACKs).
:class:`ThreadedServer` serves each connection on its own thread and remembers them, so that stopping the endpoint
can shut every connection down and join its thread. Nothing here knows the endpoint: it passes its own request
handler in as ``answer``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Answer", "RequestHandler", "ThreadedServer"]


class RequestHandler(BaseHTTPRequestHandler):
    """Passes every request to its server's ``answer``; writes each answer in one packet."""

    protocol_version = "HTTP/1.1"
    server_version = "SimulatedOpenAI/1.0"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        pass

    def _dispatch(self, method: str) -> None:
        server = self.server
        if not isinstance(server, ThreadedServer):
            raise TypeError(f"RequestHandler serves a ThreadedServer, not {type(server).__name__}")
        server.answer(self, method)

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def read_body(self) -> bytes:
        """The request's body, read by ``Content-Length`` or, for ``Transfer-Encoding: chunked``, chunk by chunk."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def send_all(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Status line, headers and body in one ``sendall`` (no delayed-ACK stall between packets)."""
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Server: {self.server_version}",
            f"Date: {self.date_time_string()}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
        ]
        lines.extend(f"{name}: {value}" for name, value in headers)
        if self.close_connection:
            lines.append("Connection: close")
        else:
            lines.append("Connection: keep-alive")
        self.connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


Answer = Callable[[RequestHandler, str], None]
"""Answers one request: called with the handler (to read the body and send the answer) and the HTTP method."""


class ThreadedServer(ThreadingHTTPServer):
    """A thread per connection, each remembered until it ends, so that :meth:`close_connections` can end them.

    Args:
        address: ``(host, port)`` to bind; port 0 picks a free one.
        answer: Called for every request with its handler and HTTP method.
    """

    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], answer: Answer):
        self.answer = answer
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        super().__init__(address, RequestHandler)

    def process_request(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        if not isinstance(request, socket.socket):  # a TCP server's requests are the sockets it accepted
            raise TypeError(f"expected a connected socket, got {type(request).__name__}")
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address), name="sim-endpoint-conn", daemon=True
        )
        with self._connections_lock:
            self._connections[request] = thread
        thread.start()

    def _serve_connection(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # a client that went away mid-request
            pass
        finally:
            self.shutdown_request(request)
            with self._connections_lock:
                self._connections.pop(request, None)

    def close_connections(self, timeout: float = 5.0) -> None:
        """Shut every open connection down and join its thread (``timeout`` seconds in all)."""
        with self._connections_lock:
            items = list(self._connections.items())
        for sock, _ in items:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for _, thread in items:
            thread.join(max(0.0, deadline - time.monotonic()))

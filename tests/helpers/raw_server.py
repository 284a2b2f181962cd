"""A local TCP server (127.0.0.1 only, in a daemon thread) that answers every request with fixed bytes:
an endpoint that misbehaves (garbage, hundreds of header lines) for the preemption notice watch."""

from __future__ import annotations

import contextlib
import socketserver
import threading

GARBAGE = bytes((i * 167 + 13) % 256 for i in range(512)) + b"\r\n\r\n"  # no status line: BadStatusLine
HEADERS = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Header-%d: v\r\n" % i for i in range(200)) + b"\r\nTRUE"
LONG_LINE = b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\nTRUE"  # LineTooLong
ANSWERS = {"garbage": GARBAGE, "200_headers": HEADERS, "long_header_line": LONG_LINE}


class _Answer(socketserver.StreamRequestHandler):
    timeout = 5  # a client that sends nothing does not hold the thread

    def handle(self):
        self.server.hits += 1
        while self.rfile.readline(65_537) not in (b"\r\n", b"\n", b""):  # the request's head
            pass
        self.wfile.write(self.server.answer)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextlib.contextmanager
def answering(answer: bytes):
    """`http://127.0.0.1:PORT/` answering `answer` to every request; `.hits` counts the requests."""
    server = _Server(("127.0.0.1", 0), _Answer)
    server.answer, server.hits = answer, 0
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1/instance/preempted"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)

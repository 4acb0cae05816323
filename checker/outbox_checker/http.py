"""``/healthz``, ``/readyz`` and ``/metrics`` of a checker replica.

Loopback by default: metrics name topics and partitions, which is nobody's
business outside the pod unless the operator says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from outbox.errors import ConfigurationError


def serve(
    address: str, healthy: Callable[[], bool], ready: Callable[[], bool]
) -> ThreadingHTTPServer:
    """Start serving on ``host:port`` in a daemon thread; the caller shuts it down."""
    host, port = address.rsplit(":", 1)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._reply(200, generate_latest(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                ok = healthy()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"stalled\n")
            elif self.path == "/readyz":
                ok = ready()
                self._reply(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
            else:
                self._reply(404, b"not found\n")

        def _reply(self, status: int, body: bytes, kind: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the log

    try:
        server = ThreadingHTTPServer((host, int(port)), Handler)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve the probes and metrics on {address}: {exc.strerror or exc}; pass"
            " --http-address HOST:PORT (OUTBOX_HTTP_ADDRESS) with a free port, or '' for none"
        ) from None
    threading.Thread(target=server.serve_forever, name="checker-http", daemon=True).start()
    return server

#!/usr/bin/env python3
"""The checker image's HEALTHCHECK: exit 0 while the checker's /healthz answers 200.

The probe port follows ``OUTBOX_HTTP_ADDRESS`` (the image sets ``0.0.0.0:9464``; a
container given another address is still probed where its checker listens), and
the check runs in the container, so a wildcard address is asked on loopback. The
image has no curl: the standard library's urlopen raises on a 503 "stalled" and
on a refused connection alike, and either is exit 1, which is what the engine counts.
"""

from __future__ import annotations

import os
import sys
import urllib.request

DEFAULT_ADDRESS = "127.0.0.1:9464"
WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def health_url(address: str) -> str:
    """The /healthz URL for a checker bound to ``address`` (``host:port``)."""
    host, _, port = address.rpartition(":")
    if host in WILDCARDS:
        host = "127.0.0.1"
    return f"http://{host}:{port}/healthz"


def main() -> int:
    """0 if the checker says it is healthy, 1 otherwise (and why, on stderr)."""
    address = os.environ.get("OUTBOX_HTTP_ADDRESS", DEFAULT_ADDRESS)
    if not address:
        print("OUTBOX_HTTP_ADDRESS is empty: the checker serves no probe", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(health_url(address), timeout=3) as response:
            return 0 if response.status == 200 else 1
    except OSError as exc:
        print(f"{health_url(address)}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""Serve a built inspect site on 127.0.0.1 with python's http.server until Ctrl-C (or a time limit)."""
from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path
from typing import Optional

from qkvqa.errors import ConfigError

REQUEST_TIMEOUT_S = 10          # a client that stalls mid-request is dropped after this long


class _Handler(http.server.SimpleHTTPRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args) -> None:      # noqa: A002 (http.server's name)
        pass                                                # one line per shard request would bury the URL


def make_server(directory: Path, port: int) -> http.server.HTTPServer:
    """A single-threaded (bounded: one request at a time, each within REQUEST_TIMEOUT_S) server of `directory` on
    127.0.0.1:`port` (0: a free port); ConfigError when the port is taken."""
    handler = functools.partial(_Handler, directory=str(directory))
    try:
        return http.server.HTTPServer(("127.0.0.1", port), handler)
    except OSError as e:
        raise ConfigError(f"--serve {port}: cannot listen on 127.0.0.1:{port} ({e.strerror}); choose another port, "
                          "or open the site's index.html directly (file://)") from None


def serve(directory: Path, port: int, seconds: Optional[float] = None) -> None:
    """Serve `directory` until Ctrl-C, or for `seconds` when given; prints the URL first."""
    server = make_server(directory, port)
    host, bound = server.server_address[:2]
    print(f"serving {directory} at http://{host}:{bound}/index.html (Ctrl-C stops)", flush=True)
    timer = threading.Timer(seconds, server.shutdown) if seconds else None
    if timer:
        timer.daemon = True
        timer.start()
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        if timer:
            timer.cancel()
        server.server_close()

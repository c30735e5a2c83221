"""Serve a built inspect site on 127.0.0.1 until Ctrl-C (or a time limit): its own files only, to local hosts only.

Only the files the site's marker lists are served (no directory listings, nothing else in the folder), a request
whose `Host` is not 127.0.0.1 / localhost at the served port is refused (DNS rebinding), and each connection has
its own thread and a deadline for its whole request, so a client that trickles bytes holds up nobody
(docs/security.md).
"""

from __future__ import annotations

import functools
import http.server
import socket
import threading
import urllib.parse
from pathlib import Path
from typing import Optional

from qkvqa.errors import ConfigError

REQUEST_TIMEOUT_S = 10  # a client whose request is not read within this long is dropped
MAX_CONNECTIONS = 32  # connections served at once; more wait in the listen queue


class _Handler(http.server.SimpleHTTPRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def __init__(self, *args, allowed: frozenset[str], port_of, **kwargs):
        self.allowed, self.port_of = allowed, port_of
        super().__init__(*args, **kwargs)

    def setup(self) -> None:
        super().setup()
        # The socket timeout bounds one recv; a client sending a byte every few seconds would never hit it, so the
        # whole connection also has a deadline that shuts the socket.
        self._deadline = threading.Timer(REQUEST_TIMEOUT_S, self._drop)
        self._deadline.daemon = True
        self._deadline.start()

    def _drop(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def finish(self) -> None:
        self._deadline.cancel()
        try:
            super().finish()
        except OSError:
            pass

    def _host_ok(self) -> bool:
        host = (self.headers.get("Host") or "").strip().lower()
        port = self.port_of()
        return host in {f"127.0.0.1:{port}", f"localhost:{port}"}

    def send_head(self):
        if not self._host_ok():
            self.send_error(403, "this server answers only requests for 127.0.0.1 or localhost at its own port")
            return None
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        if path == "/":
            self.send_response(302)
            self.send_header("Location", "/index.html")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        relative = urllib.parse.unquote(path).lstrip("/")
        if relative not in self.allowed:
            self.send_error(404, "not a file of this site")
            return None
        return super().send_head()

    def list_directory(self, path):  # never reached (directories are not in `allowed`)
        self.send_error(404, "no listings")
        return None

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's name)
        pass  # one line per shard request would bury the URL


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *args, **kwargs):
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address):
        self.slots.acquire()
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def make_server(directory: Path, port: int) -> http.server.HTTPServer:
    """A threaded server of the inspect site in `directory` on 127.0.0.1:`port` (0: a free port), serving only the
    files its marker lists; ConfigError when the folder is no site or the port is taken."""
    from qkvqa.inspect.site import SITE_MARKER, site_dir

    owned = site_dir(Path(directory))
    allowed = frozenset(f for f in owned.files() if owned.inside(f) is not None)
    if not allowed:
        raise ConfigError(
            f"--serve: {directory} is not an inspect site (no {SITE_MARKER} listing its files); "
            "build it with `qkvqa inspect RUN_DIR --out DIR` first"
        )
    holder: list = []
    handler = functools.partial(
        _Handler, directory=str(directory), allowed=allowed, port_of=lambda: holder[0].server_address[1]
    )
    try:
        server = _Server(("127.0.0.1", port), handler)
    except OSError as e:
        raise ConfigError(
            f"--serve {port}: cannot listen on 127.0.0.1:{port} ({e.strerror}); choose another port, "
            "or open the site's index.html directly (file://)"
        ) from None
    holder.append(server)
    return server


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

"""Issue 31 items 3 and 4: `inspect --out` and `synth --out` never delete or serve a user's files; `--serve` serves the
site's own files only, to local Host headers only, and a slow client holds up nobody."""

from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest

from qkvqa.errors import ConfigError
from qkvqa.inspect.site import SITE_MARKER, build_site
from qkvqa.synth.world import WORLD_MARKER, generate_world
from tests.unit.test_inspect_site import image, make_trace, runs, write_run  # noqa: F401 (fixtures)


def test_inspect_refuses_a_folder_of_the_users_and_deletes_nothing(runs, tmp_path):
    out = tmp_path / "mine"
    (out / "data" / "x").mkdir(parents=True)
    (out / "data" / "x" / "notes.js").write_text("mine")
    (out / "thumbs").mkdir()
    (out / "thumbs" / "holiday.jpg").write_bytes(b"jpeg")
    (out / "index.html").write_text("my page")
    with pytest.raises(
        ConfigError,
        match=f"mine: this folder holds files that qkvqa inspect --out did not write "
        f"\\(no {SITE_MARKER}\\).*choose a new or empty folder",
    ):
        build_site(runs[0], out=out)
    assert (out / "data" / "x" / "notes.js").read_text() == "mine"
    assert (out / "thumbs" / "holiday.jpg").read_bytes() == b"jpeg"
    assert (out / "index.html").read_text() == "my page"


def test_a_file_the_user_adds_to_a_site_survives_a_rebuild(runs, tmp_path):
    out = tmp_path / "site"
    build_site(runs[0], out=out, shard_size=2)
    (out / "data" / "a" / "my_notes.js").write_text("mine")
    (out / "thumbs" / "extra.jpg").write_bytes(b"jpeg")
    small = write_run(tmp_path, "small", [make_trace(i, True, 1, 1) for i in range(3)])
    build_site(small, out=out, shard_size=2)
    assert (out / "data" / "a" / "my_notes.js").read_text() == "mine"
    assert (out / "thumbs" / "extra.jpg").read_bytes() == b"jpeg"
    assert sorted(p.name for p in (out / "data" / "a").glob("0*.js")) == ["00000.js", "00001.js"]


@pytest.fixture
def served(runs, tmp_path):
    from qkvqa.inspect.serve import make_server

    site = build_site(runs[0], out=tmp_path / "site")
    (site.out / "secret.env").write_text("WANDB_API_KEY=hunter2")
    server = make_server(site.out, 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def _get(port: int, path: str, host: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("GET", path, skip_host=True)
    conn.putheader("Host", f"127.0.0.1:{port}" if host is None else host)
    conn.endheaders()
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def test_serve_gives_the_sites_files_and_nothing_else(served):
    assert _get(served, "/index.html")[0] == 200
    assert _get(served, "/data/index.js")[0] == 200
    assert _get(served, "/", host=f"localhost:{served}")[0] == 302
    for path in (
        "/secret.env",
        f"/{SITE_MARKER}",
        "/data/",
        "/data",
        "/thumbs/",
        "/data/../secret.env",
        "/%2e%2e/secret.env",
    ):
        status, body = _get(served, path)
        assert status == 404 and b"hunter2" not in body, path


def test_serve_refuses_a_foreign_host_header(served):
    for host in ("evil.example:80", f"evil.example:{served}", "127.0.0.1:1", ""):
        assert _get(served, "/index.html", host=host)[0] == 403, host


@pytest.mark.slow  # waits out the server's per-request timeout: make test, not the fast loop
def test_a_trickling_client_blocks_nobody_and_is_dropped(served):
    slow = socket.create_connection(("127.0.0.1", served), timeout=30)
    slow.sendall(b"G")
    started = time.monotonic()
    assert _get(served, "/index.html")[0] == 200  # served beside it at once
    assert time.monotonic() - started < 5
    closed = False
    deadline = time.monotonic() + 25
    try:
        while time.monotonic() < deadline:  # one byte every second: never idle for the timeout
            slow.sendall(b"E")
            time.sleep(1)
    except OSError:
        closed = True  # the server shut the connection
    if not closed:
        slow.settimeout(1)
        closed = slow.recv(1) == b""
    slow.close()
    assert closed


@pytest.mark.slow
def test_synth_over_an_old_world_keeps_the_users_files(tmp_path):
    out = tmp_path / "world"
    generate_world(out, entities=12, build_store=False)
    assert (out / WORLD_MARKER).is_file()
    (out / "notes.txt").write_text("mine")
    (out / "runs" / "r1").mkdir(parents=True)
    (out / "runs" / "r1" / "scores.json").write_text("{}")
    (out / "evqa" / "my_extra.csv").write_text("mine")
    generate_world(out, entities=12, seed=1, build_store=False)
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "runs" / "r1" / "scores.json").read_text() == "{}"
    assert (out / "evqa" / "my_extra.csv").read_text() == "mine"
    assert (out / "world.json").is_file()


def test_synth_refuses_a_folder_of_the_users(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "keep.json").write_text("{}")
    with pytest.raises(ConfigError, match="holds files that qkvqa synth --out did not write"):
        generate_world(tmp_path, entities=12, build_store=False)
    assert (tmp_path / "runs" / "keep.json").read_text() == "{}"

"""FAKE Hub endpoint that is only reachable: a loopback HTTP server answering every request with
503 and a body saying it is a stand-in.

traylm refuses at once to start a Hub model that is not downloaded when the Hub cannot be
reached (engines/hub/reach.py). The FAKE engine "serves" made-up repo ids such as "org/fake"
that no cache holds, and this machine has no network to huggingface.co; tests point HF_ENDPOINT
here (tests/conftest.py does it for every test) so that those starts go on as with network. A
test that talks to the Hub starts the FAKE Hub (tests/fakes/hub_server.py) instead, and a test
of the offline case points HF_ENDPOINT at a closed port.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import threading
from collections.abc import Iterator

BODY = b'{"error": "FAKE Hub endpoint (tests/fakes/hub_endpoint.py): reachable, answers nothing"}'


class _Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self) -> None:
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(BODY)

    do_GET = do_HEAD = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        return None


class ReachableEndpoint:
    def __init__(self) -> None:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ReachableEndpoint:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@contextlib.contextmanager
def reachable_hub_env() -> Iterator[str]:
    """For scripts (tests/perf): HF_ENDPOINT at a ReachableEndpoint while the block runs,
    unless the environment names a Hub already."""
    if os.environ.get("HF_ENDPOINT"):
        yield os.environ["HF_ENDPOINT"]
        return
    endpoint = ReachableEndpoint().start()
    os.environ["HF_ENDPOINT"] = endpoint.url
    try:
        yield endpoint.url
    finally:
        del os.environ["HF_ENDPOINT"]
        endpoint.stop()

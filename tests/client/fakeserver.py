"""A scripted HTTP server on 127.0.0.1 for the client's fault tests: canned statuses, dropped
connections and slow replies, in the order a test queues them; records every request it saw."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from querator.api.paths import split_scoped


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def plain(self) -> str:
        """The path with a scoped route's ``/queues/<queue>`` taken out: which call this was."""
        return plain_path(self.path)


@dataclass
class Action:
    """What to answer: ``status``/``body``; ``drop`` closes the connection without a reply;
    ``delay`` waits first."""

    status: int = 200
    body: Any = field(default_factory=lambda: {"code": 200})
    drop: bool = False
    delay: float = 0.0
    raw: bytes | None = None


def plain_path(path: str) -> str:
    """``/v1/queues/<queue>/queue.lease`` → ``/v1/queue.lease``; any other path as it is."""
    split = split_scoped(path)
    return f"/v1/{split[1]}" if split else path


def envelope(status: int, message: str, code_text: str = "") -> Action:
    return Action(status=status, body={"code": status, "code_text": code_text or "X", "message": message})


class FakeServer:
    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.script: list[Action] = []
        #: Per-path scripts, used before ``script`` (for callers with several threads).
        self.by_path: dict[str, list[Action]] = {}
        #: Per-path answer once a path's script is used up.
        self.default_by_path: dict[str, Action] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Keep-alive requests would otherwise wait ~40 ms each on delayed ACKs (measured).
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with outer.lock:
                    outer.seen.append(
                        Seen(
                            self.command, self.path, dict(self.headers.items()), body, self.client_address[1]
                        )
                    )
                    # Scripts name the plain path; the client sends a queue's calls on its scoped one.
                    plain = plain_path(self.path)
                    queued = outer.by_path.get(plain)
                    if queued:
                        action = queued.pop(0)
                    elif outer.script:
                        action = outer.script.pop(0)
                    else:
                        action = outer.default_by_path.get(plain, Action())
                if action.delay:
                    time.sleep(action.delay)
                if action.drop:
                    self.close_connection = True
                    self.connection.close()
                    return
                data = action.raw if action.raw is not None else json.dumps(action.body).encode()
                self.send_response(action.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = _serve  # noqa: N815
            do_POST = _serve  # noqa: N815

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})

    def start(self) -> FakeServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def then(self, *actions: Action) -> FakeServer:
        with self.lock:
            self.script.extend(actions)
        return self

    def on(self, path: str, *actions: Action, then: Action | None = None) -> FakeServer:
        with self.lock:
            self.by_path.setdefault(path, []).extend(actions)
            if then is not None:
                self.default_by_path[path] = then
        return self

    def reset(self) -> None:
        with self.lock:
            self.seen.clear()
            self.script.clear()
            self.by_path.clear()
            self.default_by_path.clear()

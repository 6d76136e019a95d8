"""Local development: an embedded DynamoDB-compatible store (moto), served single-threaded.

moto in-process and its stock threaded server do not make conditional writes atomic under
concurrent requests (measured: two winners for one item). Serving the moto
WSGI app from one thread makes every request, and so every conditional write, atomic. Needs the
``local`` extra (moto[server]); never part of the Lambda layer.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

LOOPBACK = "127.0.0.1"


class EmbeddedDynamoDB:
    """A moto DynamoDB endpoint on 127.0.0.1 in a background thread; ``port=0`` picks a free port."""

    def __init__(self, *, host: str = LOOPBACK, port: int = 0) -> None:
        from moto.moto_server.werkzeug_app import (  # noqa: PLC0415
            DomainDispatcherApplication,
            create_backend_app,
        )
        from werkzeug.serving import WSGIRequestHandler, make_server  # noqa: PLC0415

        class QuietHandler(WSGIRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                """The queue's own server logs requests; the store's would only be noise."""

        app = DomainDispatcherApplication(create_backend_app)
        self._server: Any = make_server(
            host, port, app, threaded=False, processes=1, request_handler=QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="embedded-dynamodb", daemon=True
        )

    @property
    def endpoint_url(self) -> str:
        return f"http://{self._server.host}:{self._server.port}"

    def start(self) -> EmbeddedDynamoDB:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> EmbeddedDynamoDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """``python -m querator.localstore --port N``: serve until killed; prints the endpoint first."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    store = EmbeddedDynamoDB(port=args.port)
    sys.stdout.write(f"{store.endpoint_url}\n")
    sys.stdout.flush()
    store._server.serve_forever()


if __name__ == "__main__":
    main()

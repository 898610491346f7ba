"""moto's DynamoDB on a loopback port, one request at a time, for the demo and the tests.

moto's own server handles requests on threads and checks a ConditionExpression apart from the
write that follows, so two concurrent conditional writes can both succeed — DynamoDB (and
dynalite) never allow that. Serving moto's WSGI app on a single-threaded werkzeug server makes
each request atomic again. Single-threaded werkzeug speaks HTTP/1.0 (one request per
connection), so one idle client can never block the others.

Run it as a process: ``python -m supervisor.devtools.local_dynamodb --port 8000``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import BaseWSGIServer, make_server


class LocalDynamoDB:
    """A started server on ``host:port`` (port 0 = a free one); ``url`` once started."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        app = DomainDispatcherApplication(create_backend_app)
        self._server: BaseWSGIServer = make_server(
            host, port, app, threaded=False, request_handler=MotoRequestHandler
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET address
        return f"http://{host}:{port}"

    def start(self) -> LocalDynamoDB:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="local-dynamodb", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    server = LocalDynamoDB(args.host, args.port)
    print(f"local DynamoDB (moto) on {server.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is the way to stop it
        server.serve_forever()


if __name__ == "__main__":
    main()

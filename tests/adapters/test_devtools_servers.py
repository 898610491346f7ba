"""The tests' DynamoDB servers stay up for the whole session, whatever the clients do."""

from __future__ import annotations

import socket
import struct
import time
from urllib.parse import urlsplit

from supervisor.devtools.servers import answers_http, start_dynalite


def test_dynalite_outlives_a_client_that_resets_in_the_middle_of_a_request() -> None:
    """A SIGKILLed supervisor resets its connections mid-request; dynalite 4.0.0 alone would end
    on it (architect/dynalite#183), and every later test of the session with it."""
    with start_dynalite() as server:
        port = urlsplit(server.url).port
        assert port is not None
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n{")
            time.sleep(0.2)  # dynalite is reading the body
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        time.sleep(0.3)  # the close was a reset: dynalite's request failed with "aborted"
        assert server.proc.poll() is None
        assert answers_http(port)

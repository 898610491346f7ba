"""TLS for wss:// feeds: the client context. (The warning when certificates are not checked is
``contract.pipe.VERIFY_OFF_WARNING``: the supervisor logs it at start, each child at each connect.)

The handshake itself is done by the WebSocket adapter (adapters/websocket.py), which reports a
failed one at once, with its reason ("certificate verify failed").
"""

from __future__ import annotations

import ssl


def client_tls_context(ca_bundle: str, verify: bool) -> ssl.SSLContext:
    """The context for wss:// feeds: the system's trust store, or ``ca_bundle``'s CAs; with
    ``verify`` false, no certificate or host name check at all. Raises OSError (ssl.SSLError
    is one) or ValueError when the bundle cannot be loaded."""
    context = ssl.create_default_context(cafile=ca_bundle or None)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context

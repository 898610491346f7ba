"""systemd's notify protocol without extra packages: datagrams to ``$NOTIFY_SOCKET``.

``Type=notify`` units learn readiness (READY=1), a status line (STATUS=), liveness (WATCHDOG=1,
which we send only while the event loop *and* the lease heartbeat are healthy), shutdown
(STOPPING=1) and more time to drain (EXTEND_TIMEOUT_USEC). With no ``$NOTIFY_SOCKET`` every call
does nothing, so the same binary runs under systemd, in a container or in a terminal.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("shardvisor.sd_notify")


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # "@name" is an abstract socket: its address starts with a NUL byte.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_interval = _watchdog_interval(env)
        self._sock: socket.socket | None = None
        self._failed = False

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def notify(self, **fields: object) -> None:
        """Send ``KEY=value`` lines (keys upper-cased). Failures are logged once, never raised:
        a broken notify socket must not take the fleet down."""
        if not self.address:
            return
        payload = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # Never block the event loop that holds the leases: a full queue on the
                # receiver's side drops this notification (logged) instead.
                self._sock.setblocking(False)
            self._sock.sendto(payload, self.address)
            self._failed = False
        except OSError as exc:
            if not self._failed:
                log.warning("sd_notify to %r failed: %s", self.address, exc)
            self._failed = True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Half of WATCHDOG_USEC (systemd's advice), or None when no watchdog is asked of us."""
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):
        return None  # meant for another process (e.g. our parent)
    return int(usec) / 1e6 / 2

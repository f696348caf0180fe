"""A free TCP port on the loopback for a server a test starts (the studio, the --backend page, a fake Hub)."""

import socket


def free_port() -> int:
    """A port nothing listens on now (the OS's pick); the caller binds it next."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

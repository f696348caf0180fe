"""Which names the app answers to, and which origins are its own: the configuration of ``app.guard``.

A page elsewhere can point a name it controls at this machine (DNS rebinding) and drive the API from the
visitor's browser; such a request carries that name in ``Host``. So a request is served only when its ``Host`` is
one of the app's own names: the loopback names, ``--host``, this machine's names when listening on every address,
an address literal equal to the address the connection arrived on (rebinding needs a name), or, with ``--share``, a
share link. Gradio's tunnel (``gradio/tunneling.py``) runs frpc's ``http`` proxy with a random subdomain and no
``host_header_rewrite``, so visitors of ``https://<id>.gradio.live`` arrive with ``Host: <id>.gradio.live``.

Behind a reverse proxy under another domain (``--allow-host NAME``), ``NAME`` is one of the app's names and
``https://NAME`` one of its origins, whether the proxy passes ``Host: NAME`` on or rewrites it to the loopback address
it forwards to (the browser still sends ``Origin: https://NAME``).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
EVERY_ADDRESS = frozenset({"", "0.0.0.0", "::"})
SHARE_DOMAIN = "gradio.live"  # Gradio's share server: links are https://<random id>.gradio.live
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@dataclass(frozen=True)
class AllowedHosts:
    """The ``Host`` names the app serves (lower case, no port), the share domain (None: no share link), and
    whether others can reach the app (a share link or a non-loopback ``--host``: uploads are then budgeted)."""

    names: frozenset[str] = LOOPBACK_NAMES
    share_domain: str | None = None
    others_reach: bool = False
    proxy_origins: frozenset[tuple[str, int | None]] = frozenset()  # ``--allow-host``'s https origins (name, port)

    @classmethod
    def for_launch(cls, host: str, *, share: bool, proxied: tuple[str, ...] = ()) -> AllowedHosts:
        """What ``launch.py --host HOST [--share] [--allow-host NAME ...]`` answers to: the loopback names and
        ``host``; for every address (``0.0.0.0`` / ``::``) this machine's names (an address literal of it is matched
        per connection); each ``proxied`` name (a reverse proxy's, maybe with a port), its origin ``https://NAME``."""
        origins = frozenset(host_and_port(proxy_name(name), "https") for name in proxied)
        names = set(LOOPBACK_NAMES) | {name for name, _ in origins}
        if host.lower() in EVERY_ADDRESS:
            machine = socket.gethostname().lower()
            names |= {machine, f"{machine}.local", socket.getfqdn().lower()}
        else:
            names.add(_bare(host.lower()))
        reach = share or bool(proxied) or host.lower() not in LOOPBACK_NAMES | {"[::1]"}
        return cls(frozenset(names - {""}), SHARE_DOMAIN if share else None, reach, origins)

    def own_origin(self, url: str, host_header: str) -> bool:
        """Whether ``url`` (an ``Origin`` or a ``Referer``) is this app's: the origin ``Host`` names, or the https
        origin of a reverse proxy's name (``proxied``)."""
        if origin_matches(url, host_header):
            return True
        try:
            parts = urlsplit(url.strip())
        except ValueError:
            return False
        return parts.scheme == "https" and bool(parts.netloc) and host_and_port(parts.netloc, "https") in \
            self.proxy_origins

    def allows(self, host_header: str, local_address: str | None = None) -> bool:
        """Whether a request with ``Host: host_header`` that arrived on ``local_address`` is for this app."""
        name = host_and_port(host_header)[0]
        if not name:
            return False
        if name in self.names or (local_address is not None and _same_address(name, local_address)):
            return True
        # exactly one label under the share domain: Gradio's random subdomain
        return bool(self.share_domain) and name.endswith("." + self.share_domain) and \
            "." not in name[: -len(self.share_domain) - 1]


class HostNameError(ValueError):
    """An ``--allow-host`` value that is no host name."""


def proxy_name(raw: str) -> str:
    """``raw`` (an ``--allow-host`` value: a host name, maybe with ``:port``) lower case; ``HostNameError`` for
    anything else (an URL, a path, a user name, a wildcard)."""
    name = raw.strip().lower()
    if not name or any(c in name for c in "/@*?# \\") or not host_and_port(name, "https")[0]:
        raise HostNameError(f"not a host name: {raw!r} (give the name the proxy serves, e.g. studio.example.org)")
    return name


def host_and_port(netloc: str, scheme: str = "") -> tuple[str, int | None]:
    """``("name", port)`` of a ``Host`` value (or an URL's netloc): lower case, no brackets; a port that is its
    scheme's default is None, so ``https://x`` and ``Host: x`` compare equal."""
    netloc = netloc.strip().lower().rpartition("@")[2]
    try:
        parts = urlsplit(f"//{netloc}")
        name, port = parts.hostname or "", parts.port
    except ValueError:  # a port that is no number, or an unclosed bracket
        return "", None
    default = (DEFAULT_PORTS[scheme],) if scheme in DEFAULT_PORTS else (80, 443)  # a Host header has no scheme
    if port in default:
        port = None
    return name, port


def origin_matches(url: str, host_header: str) -> bool:
    """Whether ``url`` (an ``Origin`` or a ``Referer``) is the origin this request's ``Host`` names."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False  # "null" (a sandboxed frame, a file: page) included
    own = host_and_port(host_header)
    return own[0] != "" and host_and_port(parts.netloc, parts.scheme) == own


def _bare(name: str) -> str:
    return name[1:-1] if name.startswith("[") and name.endswith("]") else name


def _same_address(name: str, local_address: str) -> bool:
    try:
        return ipaddress.ip_address(name) == ipaddress.ip_address(local_address.split("%")[0])
    except ValueError:
        return False

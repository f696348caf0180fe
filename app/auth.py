"""Who may open the page: several people, each with their own password, stored only as salted scrypt hashes.

The users come from a file (``--auth-file``: one ``name:scrypt$n$r$p$salt$hash`` line each, written by
``launch.py --add-user NAME``) or from ``HEADINFER_AUTH`` (the same lines, or ``name:password`` pairs, hashed as
they are read), one per line; never from the command line, where ``ps`` shows a password to everyone on the machine.

``Authenticator.check`` is what Gradio's ``launch(auth=...)`` calls with (name, password). Gradio 6 awaits a
coroutine function on its event loop (and would call a plain function there too, blocking it), so ``check`` is
``async``: the scrypt derivation runs in a worker thread and a refusal never sleeps. Wrong passwords are slowed by
``LoginThrottle``: after ``FREE_FAILURES`` for one name (or ``FREE_FAILURES_PER_ADDRESS`` from one address) each
further attempt is refused unchecked until a lock that doubles with every failure has passed.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

ENV_VAR = "HEADINFER_AUTH"
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1  # 16 MiB and ~50 ms per derivation: a guess costs the guesser too
SALT_BYTES, HASH_BYTES = 16, 32
FREE_FAILURES = 5  # wrong passwords for one name before each further attempt waits for a lock
FREE_FAILURES_PER_ADDRESS = 20  # from one outside address (several people may share one, as behind a NAT)
FIRST_LOCK_SECONDS, LONGEST_LOCK_SECONDS = 1.0, 300.0  # the lock doubles with each failure past the free ones
FORGET_SECONDS = 60.0  # a streak of failures is forgotten after a minute with none (once its lock has passed)
MAX_TRACKED = 10_000  # names and addresses remembered at most (made-up names must not grow memory without end)
HASHING_AT_ONCE = 1  # scrypt derivations at once (16 MiB and a core each): a login flood takes one core at most
# What the login page says (Gradio shows "Incorrect credentials" for a refusal too): why a right password may wait.
LOGIN_MESSAGE = (f"After {FREE_FAILURES} wrong passwords for a name, each further try waits for a lock that "
                 "doubles each time (up to 5 minutes); a try during the lock is refused unchecked.")
# Others can reach the app and nobody logs in: what any visitor can do, on the console and on the page.
OPEN_WARNING = ("no login is asked (no --auth-file, no HEADINFER_AUTH): anyone who has this app's address can "
                "upload documents, have this machine's model read them and answer questions, and take turns on "
                "its compute device (within the per-visitor caps; saved documents are kept per browser). Add "
                "users with launch.py --add-user NAME --auth-file FILE and start with --auth-file FILE to require "
                "a login")
OPEN_NOTICE = ("This app is open to anyone who has its link: no login is asked. Any visitor can upload documents, "
               "have them read and ask questions, sharing this machine's compute. What you upload is read on "
               "this server; your saved documents stay with this tab and are deleted when it closes.")
_NAME = re.compile(r"^[A-Za-z0-9._@+-]{1,64}$")
_CLIENT = contextvars.ContextVar("headinfer_login_client", default="")


class AuthError(ValueError):
    """A users file or ``HEADINFER_AUTH`` that cannot be used, with the line and why."""


class LoginRefused(Exception):
    """Too many wrong passwords: the attempt was not checked. ``seconds``: until the next one is."""

    def __init__(self, message: str, seconds: float):
        super().__init__(message)
        self.seconds = seconds


# -- hashes ---------------------------------------------------------------------------------------------------
def hash_password(password: str, *, salt: bytes | None = None, n: int = SCRYPT_N, r: int = SCRYPT_R,
                  p: int = SCRYPT_P) -> str:
    """``scrypt$n$r$p$salt$hash`` (base64 without padding): self-describing, so stronger settings can come later."""
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    digest = _scrypt(password, salt, n, r, p, HASH_BYTES)
    return f"scrypt${n}${r}${p}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, encoded: str) -> bool:
    """Whether ``password`` matches ``encoded`` (a ``hash_password`` string), compared in constant time."""
    n, r, p, salt, digest = _parse_hash(encoded)
    return hmac.compare_digest(_scrypt(password, salt, n, r, p, len(digest)), digest)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, size: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=size, maxmem=256 * r * n + (8 << 20))


def _parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise AuthError("not a scrypt$n$r$p$salt$hash password hash")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, digest = _unb64(parts[4]), _unb64(parts[5])
    except ValueError:
        raise AuthError("a password hash with unreadable fields") from None
    if n < 2**10 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 16 or len(salt) < 8 or len(digest) < 16:
        raise AuthError(f"a password hash with weak or impossible settings (n={n}, r={r}, p={p})")
    return n, r, p, salt, digest


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


# -- users ----------------------------------------------------------------------------------------------------
def check_name(name: str) -> str:
    """A user name as the users file keeps it: letters, digits and ``._@+-``, 1 to 64 of them."""
    if not _NAME.match(name or ""):
        raise AuthError(f"{name!r} is not a user name: use 1 to 64 letters, digits or . _ @ + -")
    return name


def parse_users(lines: Iterable[str], *, where: str, plain_allowed: bool) -> dict[str, str]:
    """``name -> hash`` from ``name:hash`` lines (blank lines and ``#`` comments skipped). ``plain_allowed``:
    a ``name:password`` line is hashed here (``HEADINFER_AUTH``); a users file must hold hashes only."""
    users: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, secret = line.partition(":")
        if not sep or not secret:
            raise AuthError(f"{where}, line {number}: write name:hash (made by launch.py --add-user)")
        try:
            check_name(name)
            if secret.startswith("scrypt$"):
                _parse_hash(secret)
            elif plain_allowed:
                secret = hash_password(secret)
            else:
                raise AuthError("holds no password hash; add users with launch.py --add-user NAME --auth-file FILE")
        except AuthError as exc:
            raise AuthError(f"{where}, line {number}: {exc}") from None
        if name in users:
            raise AuthError(f"{where}, line {number}: {name} is there twice")
        users[name] = secret
    if not users:
        raise AuthError(f"{where} names no user")
    return users


def read_users_file(path: Path) -> dict[str, str]:
    """The users of a users file; refuses one that others may write (they could add themselves)."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AuthError(f"cannot read the users file {path}: {exc.strerror or exc}") from None
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise AuthError(f"{path} may be written by other users of this machine; chmod 600 {path}")
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        logger.warning("%s is readable by other users of this machine (its hashes can be guessed at offline); "
                       "chmod 600 %s", path, path)
    return parse_users(text.splitlines(), where=str(path), plain_allowed=False)


def users_from_env(environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """The users ``HEADINFER_AUTH`` names (None when it is unset or empty)."""
    text = (os.environ if environ is None else environ).get(ENV_VAR, "")
    if not text.strip():
        return None
    return parse_users(text.splitlines(), where=ENV_VAR, plain_allowed=True)


def add_user(path: Path, name: str, password: str) -> bool:
    """Writes ``name``'s hashed password into the users file (created 0600), replacing an earlier line of theirs;
    returns whether they were there before. The file is replaced atomically and stays 0600."""
    check_name(name)
    if not password:
        raise AuthError("an empty password")
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    kept = [line for line in lines if line.strip().partition(":")[0] != name]
    kept.append(f"{name}:{hash_password(password)}")
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as sink:
        sink.write("\n".join(kept) + "\n")
    os.chmod(scratch, 0o600)  # a scratch file left by an earlier start may have had other bits
    os.replace(scratch, path)
    return len(kept) == len(lines)


# -- the throttle ---------------------------------------------------------------------------------------------
@dataclass
class _Streak:
    failures: int = 0
    last: float = 0.0
    lock_until: float = 0.0


@dataclass
class LoginThrottle:
    """Failed logins per name and per address; ``clock`` is injectable (tests move time by hand)."""

    clock: Callable[[], float] = time.monotonic
    _streaks: dict[str, _Streak] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_seconds(self, name: str, address: str) -> float:
        """Seconds before an attempt for ``name`` from ``address`` is checked (0: now)."""
        now = self.clock()
        with self._lock:
            locks = [s.lock_until - now for key in _keys(name, address) if (s := self._streaks.get(key))]
        return max([0.0, *locks])

    def failed(self, name: str, address: str) -> None:
        now = self.clock()
        with self._lock:
            for key, free in zip(_keys(name, address), (FREE_FAILURES, FREE_FAILURES_PER_ADDRESS), strict=False):
                streak = self._streaks.pop(key, None) or _Streak()
                if now - max(streak.last, streak.lock_until) > FORGET_SECONDS:
                    streak = _Streak()
                streak.failures, streak.last = streak.failures + 1, now
                if streak.failures >= free:
                    lock = FIRST_LOCK_SECONDS * 2 ** (streak.failures - free)
                    streak.lock_until = now + min(lock, LONGEST_LOCK_SECONDS)
                self._streaks[key] = streak  # re-inserted: the dict's order is the oldest first
            while len(self._streaks) > MAX_TRACKED:
                self._streaks.pop(next(iter(self._streaks)))

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._streaks.pop(f"name:{name}", None)


def _keys(name: str, address: str) -> list[str]:
    """The streaks an attempt counts in. Loopback is no address to lock: through the share tunnel every visitor
    arrives from it, and one visitor's wrong tries must not lock everyone else out."""
    return [f"name:{name}", *([f"address:{address}"] if address and not _is_loopback(address) else [])]


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


# -- what Gradio calls ----------------------------------------------------------------------------------------
class Authenticator:
    """``check`` goes to ``gr.Blocks.launch(auth=...)``; ``users``: name -> hash."""

    def __init__(self, users: dict[str, str], *, throttle: LoginThrottle | None = None):
        if not users:
            raise AuthError("no users")
        self.users = dict(users)
        self.throttle = throttle or LoginThrottle()
        self._dummy = hash_password(secrets.token_urlsafe(12))  # an unknown name costs what a known one does
        self._hashing = threading.Semaphore(HASHING_AT_ONCE)

    def verify(self, name: str, password: str, address: str = "") -> bool:
        """The check itself (blocking: scrypt). Raises ``LoginRefused`` while a lock holds, without checking."""
        wait = self.throttle.wait_seconds(name, address)
        if wait > 0:
            raise LoginRefused(f"Too many wrong passwords for this name or from this address: try again in "
                               f"{wait:.0f} s.", wait)
        with self._hashing:
            matched = verify_password(password, self.users.get(name, self._dummy))
        if matched and name in self.users:
            self.throttle.succeeded(name)
            return True
        self.throttle.failed(name, address)
        logger.warning("failed login for %r from %s", name[:64], address or "an unknown address")
        return False

    async def check(self, name: str, password: str) -> bool:
        """Gradio's login: the derivation on a worker thread, never on the event loop. A refusal while locked is
        an HTTP 429 with the seconds to wait (Gradio passes the exception on as the response)."""
        from fastapi import HTTPException

        try:
            return await asyncio.to_thread(self.verify, name, password, _CLIENT.get())
        except LoginRefused as exc:
            raise HTTPException(status_code=429, detail=str(exc),
                                headers={"Retry-After": str(max(int(exc.seconds + 0.999), 1))}) from None


class LoginAddress:
    """ASGI middleware: notes the client address of each ``/login`` request for ``Authenticator.check`` (Gradio
    calls it with the name and password only)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("path", "").rstrip("/").endswith("/login"):
            client = scope.get("client")
            token = _CLIENT.set(client[0] if client else "")
            try:
                await self.app(scope, receive, send)
            finally:
                _CLIENT.reset(token)
            return
        await self.app(scope, receive, send)

"""A local stand-in for the Hugging Face Hub's file API, enough for ``huggingface_hub`` downloads (HF_ENDPOINT).

Serves one repository from a dict of files: ``/api/models/<repo>[/revision/<rev>]`` (model info),
``/api/models/<repo>/tree/<rev>`` (the listing with LFS SHA-256s) and ``/<repo>/resolve/<rev>/<file>`` (HEAD and
GET, with Range). Knobs for the tests: ``rate`` (bytes/s, so a download can be killed or cancelled mid-file),
``drop_after`` (close the connection after that many bytes of a file, once: the client resumes with a Range
request), ``corrupt`` (a file whose bytes differ from its listed SHA-256), ``gated`` (answer 401 GatedRepo),
``push`` (a new commit on ``main``: the repository changed upstream; earlier commits stay served by their hash).
Every request is recorded in ``requests`` as ``(method, path, range header)``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


class HubServer:
    def __init__(self, repo: str, files: dict[str, bytes]):
        self.repo, self.files = repo, files  # what main holds now
        self.head = COMMIT
        self.history: dict[str, dict[str, bytes]] = {COMMIT: files}
        self.rate: float | None = None
        self.drop_after: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.gated = False
        self.requests: list[tuple[str, str, str | None]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def push(self, files: dict[str, bytes]) -> str:
        """Makes ``files`` main's new commit and returns its hash."""
        self.head = hashlib.sha1(f"commit {len(self.history)}".encode()).hexdigest()
        self.history[self.head] = self.files = files
        return self.head

    def _at(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        sha = self.head if revision == "main" else revision
        return (sha, self.history[sha]) if sha in self.history else None

    def gets(self, name: str) -> list[str | None]:
        """The Range headers of every GET of ``name`` (None: a full request)."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith("/" + name)]

    # -- the API ---------------------------------------------------------------------------------
    def _entry(self, name: str, files: dict[str, bytes] | None = None) -> dict:
        data = (self.files if files is None else files)[name]
        entry = {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
        if name.endswith(LFS_SUFFIXES):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def _info(self, sha: str) -> dict:
        return {"id": self.repo, "modelId": self.repo, "sha": sha, "private": False, "gated": self.gated,
                "siblings": [{"rfilename": name} for name in self.history[sha]], "tags": [], "downloads": 0,
                "likes": 0}

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _json(self, payload) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _serve(self, body: bool) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append((self.command, path, self.headers.get("Range")))
                if hub.gated:
                    self.send_response(401)
                    self.send_header("X-Error-Code", "GatedRepo")
                    self.send_header("X-Error-Message", "Access to model is restricted.")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                api = f"/api/models/{hub.repo}"
                if path == api:
                    return self._json(hub._info(hub.head))
                if path.startswith(api + "/revision/") and (at := hub._at(path.split("/revision/", 1)[1])):
                    return self._json(hub._info(at[0]))
                if path.startswith(api + "/tree/") and (at := hub._at(path.split("/tree/", 1)[1].split("/")[0])):
                    return self._json([hub._entry(name, at[1]) for name in at[1]])
                prefix = f"/{hub.repo}/resolve/"
                if path.startswith(prefix):
                    revision, name = path[len(prefix):].split("/", 1)
                    at = hub._at(revision)
                    if at is not None and name in at[1]:
                        return self._file(name, body, *at)
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _file(self, name: str, body: bool, sha: str, files: dict[str, bytes]) -> None:
                data = files[name]
                entry = hub._entry(name, files)
                if name in hub.corrupt:
                    data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
                start = 0
                ranged = self.headers.get("Range")
                if ranged and body:
                    start = int(ranged.split("=")[1].split("-")[0])
                self.send_response(206 if start else 200)
                etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
                self.send_header("ETag", f'"{etag}"')
                if "lfs" in entry:
                    self.send_header("X-Linked-Etag", f'"{etag}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("X-Repo-Commit", sha)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if not body:
                    return
                drop = hub.drop_after.pop(name, None)
                sent, step = start, 16384
                while sent < len(data):
                    piece = data[sent : sent + step]
                    if drop is not None and sent + len(piece) > drop:
                        self.wfile.write(data[sent:drop])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    self.wfile.write(piece)
                    sent += len(piece)
                    if hub.rate:
                        time.sleep(len(piece) / hub.rate)

        return Handler

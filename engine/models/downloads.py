"""Fetching a model from the Hugging Face Hub the ecosystem's way: ``huggingface_hub`` into its standard cache.

``DownloadJob.run`` lists the repository once (sizes and LFS SHA-256 sums from the Hub's tree API), then fetches
the files a model needs one by one with ``hf_hub_download``, reporting bytes as they arrive. ``cancel`` stops it
at the next network read (``huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE`` at a time). What is
finished stays in the cache, so a download that was killed or cancelled resumes at the first file it had not
finished (``huggingface_hub`` itself resumes a file whose connection broke, with a Range request). Every LFS file
is checked against the SHA-256 the Hub lists for it: a corrupt one is removed and reported. ``HF_ENDPOINT`` (or
``endpoint``) points it at another server: the tests serve a tiny model locally.

A catalogue entry pinned to a commit downloads that commit. One whose revision is a branch (``main``) is pinned on
this machine by its first download (``hub_lock``: the commit ``main`` resolved to, with its file list); every later
download, resume and ``cached_snapshot`` of it uses that commit, until the owner's ``update_pin``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import hub_lock
from ..errors import CorruptDownload, DownloadCancelled, GatedModelError, ModelSourceError, RevisionLockMismatch

logger = logging.getLogger(__name__)

#: what a transformers model needs: configs, tokenizer files and safetensors weights (no .bin/.gguf duplicates)
WANTED = ("*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt")
SKIPPED = ("original/*", "consolidated*", "*/*.gguf")
CATALOGUE = Path(__file__).with_name("catalogue.json")
_COMMIT = hub_lock.COMMIT
UNPINNED = "unpinned: the first download pins the commit it fetches"


def pinned_revision(repo_id: str) -> str | None:
    """The Hub revision the catalogue pins for ``repo_id`` (a commit hash where one is recorded), or None for a
    repository the catalogue does not list. Read from ``catalogue.json`` alone: no torch, no planner."""
    for item in json.loads(CATALOGUE.read_text())["models"]:
        if item["id"] == repo_id:
            return item.get("revision")
    return None


@dataclass(frozen=True)
class DownloadProgress:
    repo_id: str
    file: str
    done_bytes: int
    total_bytes: int
    files_done: int
    files_total: int

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.total_bytes if self.total_bytes else 1.0


class DownloadJob:
    """One model download; ``run`` blocks (call it from a worker thread), ``cancel`` may come from any thread."""

    def __init__(self, repo_id: str, *, revision: str | None = None, cache_dir: str | Path | None = None,
                 token: str | bool | None = None, endpoint: str | None = None,
                 on_progress: Callable[[DownloadProgress], None] | None = None):
        # A catalogue model downloads the commit the catalogue pins, not whatever its branch holds today; a branch
        # (or no revision) is pinned on this machine by its first download. A caller's own revision is its own.
        self._locks = revision is None and not _is_commit(pinned_revision(repo_id))
        revision = revision if revision is not None else pinned_revision(repo_id)
        self.repo_id, self.revision, self.cache_dir, self.token = repo_id, revision, cache_dir, token
        self.endpoint = endpoint  # None: HF_ENDPOINT or the Hub
        self.on_progress = on_progress
        self._cancel = threading.Event()
        self._done = 0
        self._total = 0
        self._file = ""
        self._files = (0, 0)

    def cancel(self) -> None:
        self._cancel.set()

    def run(self) -> Path:
        """Downloads what is missing and returns the snapshot folder (``load_model`` takes it as a source)."""
        from huggingface_hub import HfApi, hf_hub_download  # start-up time: only the picker downloads
        from huggingface_hub.errors import GatedRepoError

        api = HfApi(endpoint=self.endpoint, token=self.token)
        pin = hub_lock.locked(self.repo_id) if self._locks else None  # a damaged lock file stops the download
        info, files = _resolve(api, self.repo_id, pin.sha if pin is not None else self.revision)
        if self._locks:
            _keep_pin(pin, self.repo_id, self.revision or "main", info.sha, files)
        self._total = sum(f.size for f in files)
        job = self
        folder: Path | None = None
        for index, entry in enumerate(files):
            self._file, self._files = entry.path, (index, len(files))
            self._check_cancel()
            try:
                path = hf_hub_download(self.repo_id, entry.path, revision=info.sha, cache_dir=self.cache_dir,
                                       token=self.token, endpoint=self.endpoint, tqdm_class=_progress_class(job))
            except GatedRepoError as error:
                raise GatedModelError(gated_message(self.repo_id)) from error
            except DownloadCancelled:
                raise
            except Exception as error:
                if self._cancel.is_set():
                    raise DownloadCancelled(f"{self.repo_id}: download cancelled during {entry.path}") from error
                raise
            if entry.lfs is not None:
                _verify(Path(path), entry.lfs.sha256, entry.path)
            folder = Path(path).parent if "/" not in entry.path else Path(path).parents[entry.path.count("/")]
            self._advance_to(sum(f.size for f in files[: index + 1]))
        self._files = (len(files), len(files))
        self._report()
        self._write_ref(info.sha)
        if folder is None:
            raise ModelSourceError(f"{self.repo_id} has no model files (config, tokenizer, safetensors)")
        return folder

    def _write_ref(self, sha: str) -> None:
        """Points the cache's ``refs/<revision>`` at the downloaded commit, as ``snapshot_download`` does, once every
        file is in: an offline lookup by name (``cached_snapshot``) then finds only complete downloads. A pinned
        commit needs no ref: the lookup goes to its snapshot folder directly."""
        if self.revision is not None and _COMMIT.match(self.revision):
            return
        from huggingface_hub import constants  # start-up time: only the picker downloads
        from huggingface_hub.file_download import repo_folder_name

        cache = Path(self.cache_dir or constants.HF_HUB_CACHE)
        root = cache / repo_folder_name(repo_id=self.repo_id, repo_type="model")
        ref = root / "refs" / (self.revision or "main")
        ref.parent.mkdir(parents=True, exist_ok=True)
        partial = ref.with_name(ref.name + ".partial")
        partial.write_text(sha)
        os.replace(partial, ref)

    # -- progress ------------------------------------------------------------------------------
    def _check_cancel(self, when: str = "before") -> None:
        if self._cancel.is_set():
            raise DownloadCancelled(f"{self.repo_id}: download cancelled {when} {self._file}")

    def _advance(self, n: int) -> None:
        self._done += n
        self._report()
        self._check_cancel("during")

    def _advance_to(self, done: int) -> None:
        self._done = done  # a cached file arrives without progress calls
        self._report()

    def _report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(DownloadProgress(self.repo_id, self._file, min(self._done, self._total), self._total,
                                              *self._files))


def _progress_class(job: DownloadJob):
    """A tqdm stand-in that forwards bytes to ``job`` (and so can cancel between two network reads)."""

    class Progress:
        def __init__(self, *args, initial: int = 0, **kwargs):
            if initial:
                job._advance(initial)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n=1):
            job._advance(int(n or 0))

        def update_transfer(self, n=1):
            pass

        def set_postfix_str(self, *args, **kwargs):
            pass

        def set_transfer_postfix_str(self, *args, **kwargs):
            pass

        def refresh(self, *args, **kwargs):
            pass

        def close(self):
            pass

    return Progress


def _resolve(api, repo_id: str, revision: str | None) -> tuple[object, list]:
    """The Hub's model info at ``revision`` and the files a model needs at the commit it resolved to."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        info = api.model_info(repo_id, revision=revision)
        files = [f for f in api.list_repo_tree(repo_id, revision=info.sha, recursive=True)
                 if hasattr(f, "size") and _wanted(f.path)]
    except GatedRepoError as error:
        raise GatedModelError(gated_message(repo_id)) from error
    except RepositoryNotFoundError as error:
        raise ModelSourceError(f"{repo_id} is not on the Hub, or is private: check the name, or log in "
                               f"with `hf auth login` if it is yours.") from error
    return info, files


def _listed(files: list) -> tuple[hub_lock.LockedFile, ...]:
    return tuple(sorted((hub_lock.LockedFile(f.path, int(f.size), f.lfs.sha256 if f.lfs is not None else None)
                         for f in files), key=lambda f: f.path))


def _keep_pin(pin: hub_lock.Locked | None, repo_id: str, branch: str, sha: str, files: list) -> None:
    """Records the first download's commit before any file is fetched (a resume after a kill finds it); at a locked
    commit, refuses a Hub whose answer differs from what was recorded."""
    listed = _listed(files)
    if pin is None:
        hub_lock.record(hub_lock.new_pin(repo_id, sha, branch, "download", listed))
    elif sha != pin.sha:
        raise RevisionLockMismatch(f"{repo_id}: the Hub answered commit {sha[:12]} when asked for the locked "
                                   f"{pin.sha[:12]}; nothing was downloaded.")
    elif pin.files and listed != pin.files:
        changed = sorted({f.path for f in set(listed) ^ set(pin.files)})
        raise RevisionLockMismatch(f"{repo_id}: the Hub's files at the locked commit {pin.short} differ from those "
                                   f"recorded at the first download ({', '.join(changed[:5])}); nothing was "
                                   f"downloaded.")
    elif not pin.files:  # pinned from a cached snapshot: the first listing seen fills the file list in
        hub_lock.record(hub_lock.Locked(pin.repo_id, pin.sha, pin.branch, pin.how, pin.locked_at, listed))


def update_pin(repo_id: str, *, endpoint: str | None = None, token: str | bool | None = None,
               api=None) -> tuple[hub_lock.Locked | None, hub_lock.Locked]:
    """The owner's "update to the latest": pins ``repo_id`` to the commit its branch holds on the Hub today (the
    next download fetches it; the old commit's snapshot stays in the cache). Returns the old pin and the new one.
    ``api``: an ``HfApi``-like object (by default the Hub's, or ``endpoint``'s)."""
    revision = pinned_revision(repo_id)
    if _is_commit(revision):
        raise ModelSourceError(f"{repo_id} is pinned by the catalogue to {revision[:7]}: an update changes "
                               f"catalogue.json (python -m engine.models.pin_catalogue), not this machine's lock.")
    if api is None:
        from huggingface_hub import HfApi  # start-up time: only the picker downloads

        api = HfApi(endpoint=endpoint, token=token)
    old = hub_lock.locked(repo_id)
    info, files = _resolve(api, repo_id, revision or "main")
    new = hub_lock.new_pin(repo_id, info.sha, revision or "main", "update", _listed(files))
    hub_lock.record(new)
    return old, new


def pin_status(repo_id: str) -> str:
    """How a Hub model's download is pinned, for the picker: by the catalogue, by this machine's first download or
    the owner's update (``hub_lock``), or not yet; a damaged lock file says so."""
    revision = pinned_revision(repo_id)
    if _is_commit(revision):
        return f"pinned to {revision[:7]}"
    try:
        pin = hub_lock.locked(repo_id)
    except ModelSourceError as error:
        return f"lock file damaged, downloads refused: {error}"
    if pin is None:
        return UNPINNED
    return f"pinned by the owner's update: {pin.short}" if pin.how == "update" else \
        f"pinned at first download: {pin.short}"


def _holds_every_file(folder: Path, pin: hub_lock.Locked) -> bool:
    """Whether ``folder`` holds each wanted file the lock lists, at its size: the lock is written before the first
    file is fetched, so a cancelled or killed download leaves a folder at the locked commit that is not a model yet."""
    return all((folder / f.path).is_file() and (folder / f.path).stat().st_size == f.size
               for f in pin.files if _wanted(f.path))


def _is_commit(revision: str | None) -> bool:
    return revision is not None and bool(_COMMIT.match(revision))


def _wanted(path: str) -> bool:
    return any(fnmatch.fnmatch(path, p) for p in WANTED) and not any(fnmatch.fnmatch(path, p) for p in SKIPPED)


def _verify(path: Path, sha256: str, name: str) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(1 << 22):
            digest.update(piece)
    if digest.hexdigest() != sha256:
        blob = path.resolve()
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise CorruptDownload(f"{name} is corrupt (SHA-256 {digest.hexdigest()[:12]}..., the Hub lists "
                              f"{sha256[:12]}...); it was removed from the cache: download again.")


def gated_message(repo_id: str) -> str:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    return (f"{repo_id} is gated: accept its license at {endpoint}/{repo_id} while logged in, create a read token "
            f"at {endpoint}/settings/tokens, then run `hf auth login` (or set HF_TOKEN) and download again.")


def cached_snapshot(repo_id: str, cache_dir: str | Path | None = None, revision: str | None = None) -> Path | None:
    """The complete snapshot of ``repo_id`` in the Hugging Face cache (at ``revision``: by default the one the
    catalogue pins, else the one this machine locked), or None (nothing is fetched). A branch's snapshot downloaded
    before any lock existed is pinned as found; a damaged lock file raises ``DamagedRevisionLock``."""
    if revision is not None or _is_commit(pinned_revision(repo_id)):
        return _snapshot(repo_id, cache_dir, revision if revision is not None else pinned_revision(repo_id))
    pin = hub_lock.locked(repo_id)
    if pin is not None:
        folder = _snapshot(repo_id, cache_dir, pin.sha)
        return folder if folder is not None and _holds_every_file(folder, pin) else None
    branch = pinned_revision(repo_id) or "main"
    folder = _snapshot(repo_id, cache_dir, branch)
    if folder is not None and _is_commit(folder.name):
        hub_lock.record(hub_lock.new_pin(repo_id, folder.name, branch, "cache"))
    return folder


def _snapshot(repo_id: str, cache_dir: str | Path | None, revision: str | None) -> Path | None:
    from huggingface_hub import snapshot_download  # start-up time: only the picker downloads

    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True,
                                      allow_patterns=list(WANTED),
                                      ignore_patterns=list(SKIPPED)))
    except Exception:  # not cached, or only partly: huggingface_hub says so by raising
        return None

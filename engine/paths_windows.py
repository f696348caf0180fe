"""Windows' rules, and the switch that forces them on Linux: ``HEADINFER_WINDOWS_SHAPED=1``.

Most 4090s are in Windows PCs, and CI is Linux. The switch turns on together every choice a Windows PC makes:
``spawn`` for child processes and a pin limit (``HEADINFER_PIN_LIMIT``, 64 MiB unless set), both at a process's
start by ``process_env.prepare_process()``; and, where ``windows_rules()`` is read, no C compiler (the torch paths:
``engine.native.library.compiler``), no hard links (snapshots copy the disk tier's files), names valid on NTFS
(``ntfs_name``), folders whose files fit Win32's path limit (``windows_path``) and the portable fallbacks
of POSIX-only calls (space reservation, locks, memory caps). On a real Windows PC ``windows_rules()`` is true without
the switch. Imports nothing of the engine, like ``paths``: every wing (``kv/``, ``native/``) may use it.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import ntpath
import os
import re
from pathlib import Path

logger = logging.getLogger(__name__)

ENV = "HEADINFER_WINDOWS_SHAPED"
MAX_NAME = 120  # characters in one name we make: NTFS allows 255 UTF-16 units; suffixes (-bf16-<key>) need room

# Reserved device names: with any extension ("con.txt") and trailing spaces, in any case. COM¹-³/LPT¹-³ too.
_RESERVED = {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$",
             *(f"{port}{n}" for port in ("COM", "LPT") for n in [*"123456789", "\u00b9", "\u00b2", "\u00b3"])}
_INVALID = re.compile(r'[<>:"/\\|?*\x00-\x1f]')


def windows_shaped() -> bool:
    """Whether ``HEADINFER_WINDOWS_SHAPED=1`` asks this (Linux) process to make Windows' choices."""
    return os.environ.get(ENV, "").strip() == "1"


def windows_rules() -> bool:
    """Whether Windows' rules hold here: on Windows, or Windows-shaped."""
    return os.name == "nt" or windows_shaped()


def ntfs_name(name: str, *, max_length: int = MAX_NAME) -> str:
    """``name`` made a valid file or folder name on NTFS (and unchanged where it is one already, so Linux keeps its
    names): ``<>:"/\\|?*`` and control characters become ``_``, trailing dots and spaces go, a reserved device
    name (``CON``, ``nul.txt``, ``COM1``) gets a leading ``_``, and a name past ``max_length`` is cut with a hash
    of the whole kept, so two long names stay apart."""
    cleaned = _INVALID.sub("_", name).rstrip(". ") or "_"
    if cleaned.split(".", 1)[0].rstrip(" ").upper() in _RESERVED:
        cleaned = f"_{cleaned}"
    if len(cleaned) > max_length:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        cleaned = f"{cleaned[:max_length - 9].rstrip('. ')}-{digest}"
    return cleaned


def is_ntfs_name(name: str) -> bool:
    """Whether ``name`` is a name NTFS (through Win32) accepts as it is."""
    return bool(name) and ntfs_name(name, max_length=255) == name


# --- Win32's path limit: 260 characters with the terminating NUL, unless the path takes the \\?\ form or the PC has
# long paths turned on (Python itself is long-path aware).
MAX_PATH = 260
LONG_PATHS_SETTING = ("long paths (LongPathsEnabled=1 under HKLM\\SYSTEM\\CurrentControlSet\\Control\\FileSystem, "
                      "or the group policy 'Enable Win32 long paths')")
# The most characters of names the studio makes under a folder (a separator included): under the cache, a converted
# model (models/<MAX_NAME>) and one of its files (a checkpoint's names are longer than anything the Hub ships);
# under a snapshot store, a snapshot's temporary folder (.tmp-<key>-<8>) and a part file of it. 20 more to spare.
UNDER_CACHE = len("/models/") + MAX_NAME + len("/model-00001-of-00009.safetensors.index.json") + 20
UNDER_STORE = len("/.tmp-") + 32 + len("-abcdefgh/layer-000-part-000000000-000000000.bin") + 20


def windows_path(folder: Path, under: int, setting: str) -> Path:
    r"""``folder``, where the studio writes names of up to ``under`` more characters, made safe for Win32's path
    limit: unchanged where the limit is no concern (not Windows' rules, short enough, long paths on); on Windows its
    ``\\?\`` form (``long_form``), which has no such limit; Windows-shaped on Linux (which has no such form) an
    ``OSError`` (ENAMETOOLONG) that names the setting to turn on and ``setting``, the folder's own to shorten."""
    if not windows_rules():
        return folder
    native = os.name == "nt"
    full = os.path.abspath(folder)
    if len(full) + under < MAX_PATH or (native and long_paths_enabled()):
        return folder
    if native:
        return Path(long_form(full))
    raise OSError(errno.ENAMETOOLONG, f"{folder} is {len(full)} characters: with the up to {under} of the names the "
                  f"studio makes under it, its files would pass Windows' {MAX_PATH}-character path limit. Turn on "
                  f"{LONG_PATHS_SETTING}, or set {setting} to a short folder such as C:\\hi", str(folder))


def long_form(path: str) -> str:
    r"""The absolute Windows ``path`` in the ``\\?\`` form Win32 takes past 260 characters, normalized first (the
    form turns Win32's own normalization off): ``C:/a/../b`` -> ``\\?\C:\b``, ``\\server\share`` ->
    ``\\?\UNC\server\share``; a path already in the form is kept."""
    if path.startswith(("\\\\?\\", "//?/")):
        return path.replace("/", "\\")
    path = ntpath.normpath(path)
    return f"\\\\?\\UNC\\{path[2:]}" if path.startswith("\\\\") else f"\\\\?\\{path}"


def long_paths_enabled() -> bool:
    """Whether this Windows PC has long paths on (the registry's LongPathsEnabled); False elsewhere."""
    try:
        import winreg

        with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, r"SYSTEM\CurrentControlSet\Control\FileSystem") as key:
            return winreg.QueryValueEx(key, "LongPathsEnabled")[0] == 1
    except (ImportError, OSError):
        return False

"""Restoring a document's K/V from a ``SnapshotStore`` instead of reading it: what happens when one cannot load.

Like the snapshot modules below it, this takes what it needs as arguments and never sees the session.
"""

from __future__ import annotations

import logging

from ..cache import HeadInferCache
from .format import SnapshotIdentity
from .snapshots import RestoreStats, SnapshotInfo, SnapshotStore
from ..errors import CorruptSnapshotError, SnapshotError

logger = logging.getLogger(__name__)


def restore_document(store: SnapshotStore, cache: HeadInferCache, identity: SnapshotIdentity,
                     info: SnapshotInfo) -> RestoreStats | None:
    """Fills ``cache`` from the snapshot ``info``; None when it cannot load (logged, and a damaged one
    deleted), so the caller reads the document instead. ``cache`` may be left partly filled then."""
    try:
        return store.restore(cache, identity, info.key)
    except CorruptSnapshotError as error:
        logger.warning("%s; deleting it and reading the document instead", error)
        store.delete(info.key)
    except (SnapshotError, OSError) as error:
        logger.warning("%s; reading the document instead", error)
    return None

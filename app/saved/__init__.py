"""Saved documents (the page's "Saved documents"): a read's KV kept on disk and reopened instead of read again.

``saved_docs.SavedDocs`` saves, lists, deletes and restores one shelf's snapshots; ``shelves.Shelves`` gives each
visitor their shelf (one for the owner alone, one per login or browser once others can reach the app);
``open_saved.OpenSaved`` is the handler piece that lists, deletes and reopens them; ``store_owner`` sweeps what a
killed save left in a shelf's folder."""

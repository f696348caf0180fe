"""How much an uploaded file may take to read: its archive's sizes, the text kept, the reading child's memory and time.

An upload is untrusted: a 1 MB EPUB, DOCX or PDF can inflate to gigabytes (a zip or FlateDecode bomb) or expand
entities without end. Each limit below is far above what a real document needs, and far below what would hurt.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB, GIB = 1 << 20, 1 << 30

# -- EPUB and DOCX: their zip's central directory, checked before anything is inflated ----------------------------
# 1 GiB: a long illustrated e-book is ~300 MB unpacked, a 1,000-page report with figures a few hundred MB.
MAX_UNPACKED_BYTES = GIB
# A member may inflate at most 200 times its packed size once it is over 4 MiB: real XHTML and WordprocessingML
# pack 5-20x, very repetitive tables under 100x; deflate's ceiling (a bomb) is ~1,030x.
MAX_RATIO = 200
RATIO_FROM_BYTES = 4 * MIB
# Members: a book's chapters, images and fonts are hundreds, a manual split per section a few thousand.
MAX_MEMBERS = 20_000

# -- The text kept of one file --------------------------------------------------------------------------------------
# The most any model here can be given of one file: the largest window in the catalogue (1,010,000 tokens), times
# the FAR_BEYOND (4) of app.sizing that offers a page range of a file up to 4 windows long, times the 4 characters
# a token averages: ~16 M characters. Beyond it no model reads a word more, and the text would only cost memory.
MAX_TEXT_CHARS = 16_000_000


@dataclass(frozen=True)
class BoxLimits:
    """What the child process that reads one file may take; past either, it is killed and the file refused.

    Attributes:
        memory_bytes: its address space (``RLIMIT_AS``, ``RLIMIT_DATA`` too), set by the child before it reads
            anything; ignored where Python has no ``resource`` module (Windows: the time limit alone holds).
        seconds: the reader's processor seconds for one file, from the request to the text back: far above what
            PDFium takes for a long book; a book of that length read by pypdf, the fallback, is the one real file this
            stops (docs/benchmarks/extraction.md, Notes from the code).
        wall_seconds: the clock's limit for one file, for a reader a busy machine starves of processor time
            (stopped saying so, not that the file stalls it).
        idle_seconds: a reader child with nothing to read exits after this long, so its memory goes back.
    """

    memory_bytes: int = 2 * GIB
    seconds: float = 60.0
    wall_seconds: float = 240.0

    def __post_init__(self):
        if not 0 < self.seconds <= self.wall_seconds:
            raise ValueError(f"a reader's limits need 0 < seconds <= wall_seconds, not {self.seconds}, "
                             f"{self.wall_seconds}")
    idle_seconds: float = 120.0

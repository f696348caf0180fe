"""The studio served in-process on a free port with the embedded SmolLM2, for browser tests."""

import pytest
from studio import served


@pytest.fixture(scope="session")
def studio_url():
    with served(chunk_size=16) as url:  # small chunks, so the progress bar visibly moves on a short document
        yield url

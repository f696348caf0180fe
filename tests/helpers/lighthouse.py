"""The three-page lighthouse document the browser tests read, and the question whose answer (AMBER-7) is on its last
page, as on the last of the page tests' short one (``SECRET_PAGES``, tests/app/conftest.py)."""

PAGES = [
    "The lighthouse of Kerrow Point stands on a rocky cape at the edge of the northern sea. Its keeper, Mara Quill, "
    "has tended the lamp for twenty years. Every evening she climbs the one hundred and twelve steps, trims the "
    "wick, polishes the great lens and writes the weather in her logbook.",
    "Storms come in autumn. The fishing boats of the harbour avoid the northern reef thanks to the light, which "
    "turns once every ten seconds and can be seen for eighteen nautical miles. In winter the supply boat comes "
    "only twice a month, so Mara keeps a store of oil, flour and candles in the cellar.",
    "The secret launch code of the lighthouse is AMBER-7. Only Mara knows it.",
]
QUESTION = "What is the secret launch code of the lighthouse?"

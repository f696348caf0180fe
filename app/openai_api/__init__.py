"""An OpenAI-compatible endpoint over the documents the app holds (``launch.py --api``): the wire format
(``schema``), the key (``keys``), which held document a prompt begins with (``library``, ``prefixes``), the wait in
the compute device's line and the answer (``completions``, ``stops``), and the routes (``routes``)."""

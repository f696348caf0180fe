"""Native code the weights and the KV both use, on the ground floor: building and loading C (``library``), a pool of
one-core torch workers (``workers``), and running a risky kernel once in a child process first (``crash_probe``)."""

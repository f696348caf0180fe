"""Models: loading, the catalogue, discovery on this machine, downloads and switching."""

"""The app's own work: reading documents, bombs in uploads, reading-time estimates, first start, the queue, many visitors."""

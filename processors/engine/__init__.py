"""The engine: decides and returns what to do, for the in-process and the Kafka transport.

``pipeline`` (events to parts, when a run is ready, what a replay skips) over ``runs`` (runs,
parts, dedupe) and ``partwire`` (parts as versioned bytes), over ``live`` (live summaries).
Its only I/O is its parts' spill files.
"""

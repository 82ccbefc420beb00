"""The profiler: a pure core, an engine that decides, and the transports that feed them.

``core`` (statistics, no I/O) is shared by all three transports: ``batch`` (finished files),
``inprocess`` (a collection in this process) and ``stream`` (Kafka), which serves through
``http``. ``engine`` (runs, parts, what a replay skips) decides for the two streaming ones.
Imports run down only (ARCHITECTURE.md, "Layers and folders"; ``lint-imports`` checks it).
"""

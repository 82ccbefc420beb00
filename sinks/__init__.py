"""Where profiles go: NeMo Gym's files (``files``); Prometheus metrics come with streaming."""

from sinks.files import InputsFile, ProfilePaths, summary_lines, write_profile

__all__ = ["InputsFile", "ProfilePaths", "summary_lines", "write_profile"]

"""Kafka plumbing: client settings (``config``), their command-line options (``options``) and
a local broker or cluster for development and tests (``local``)."""

"""Plumbing the commands and adapters share: ``command`` (how a command runs and fails),
``overrides`` (Hydra-style arguments), ``jsonl`` (reading JSONL as NeMo Gym does),
``forking`` (a forked child) and ``http_security`` (TLS and bearer tokens for HTTP)."""

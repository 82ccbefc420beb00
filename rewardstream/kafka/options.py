"""The command-line options every Kafka command shares: ``--bootstrap``, ``--topic-prefix`` and
``--group-id`` (:func:`add_option`), the ``--kafka-*`` options of :mod:`rewardstream.kafka.config`
(:func:`add_arguments`), and how a bootstrap server list is read.

Apart from it because building a command's parser must not import aiokafka and pydantic: every
``rewardstream`` command builds every parser, and start-up counts (``rewardstream snapshot``).
"""

from __future__ import annotations

import argparse
import ipaddress
import re
from typing import Any, Final, Literal

from rewardstream.contract.names import DEFAULT_TOPIC_PREFIX, check_topic_prefix

__all__ = [
    "BOOTSTRAP_HELP",
    "DEFAULT_PORT",
    "ENV_PREFIX",
    "OPTIONS",
    "KafkaFlag",
    "add_arguments",
    "add_option",
    "bootstrap_arg",
    "normalize_bootstrap",
    "topic_prefix_arg",
]

DEFAULT_PORT = 9092  # Kafka's, which its own tools and aiokafka assume for a host alone
BOOTSTRAP_HELP = "Kafka HOST[:PORT][,HOST[:PORT]...] (port 9092 if left out; PORT: 127.0.0.1)"
_BRACKETED = re.compile(r"^\[([^\]]+)\](?::(\d+))?$")

ENV_PREFIX = "REWARDSTREAM_KAFKA_"
OPTIONS = {  # the non-secret settings: passwords come from the environment only
    "security_protocol": "PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL",
    "sasl_mechanism": "PLAIN (default with a user), SCRAM-SHA-256 or SCRAM-SHA-512",
    "sasl_plain_username": "SASL user (its password: $REWARDSTREAM_KAFKA_SASL_PLAIN_PASSWORD)",
    "ssl_cafile": "CA bundle that signed the brokers' certificates (default: system CAs)",
    "ssl_certfile": "client certificate (PEM), for brokers that require one",
    "ssl_keyfile": "the client certificate's private key (PEM)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--kafka-security-protocol`` etc.: every non-secret setting, each defaulting to its
    ``REWARDSTREAM_KAFKA_*`` variable."""
    group = parser.add_argument_group(
        "Kafka security", f"also from the environment: {ENV_PREFIX}<NAME> (docs/security.md)"
    )
    for field, text in OPTIONS.items():
        flag = "--kafka-" + field.replace("sasl_plain_", "sasl_").replace("_", "-")
        group.add_argument(flag, dest=f"kafka_{field}", default=None, help=text)


def normalize_bootstrap(text: str) -> str:
    """``HOST[:PORT][,...]`` with every port written out: a host alone gets 9092, as Kafka's
    tools give it (``localhost`` -> ``localhost:9092``); a bare ``PORT`` means 127.0.0.1, as
    ``--http`` reads it; IPv6 literals are bracketed. Written out, every later reader (the
    error probe, log lines) can split it. ValueError names the entry at fault."""
    servers = []
    for entry in text.split(","):
        server = entry.strip()
        bracketed = _BRACKETED.match(server)
        if bracketed:
            host, port = f"[{bracketed.group(1)}]", bracketed.group(2) or str(DEFAULT_PORT)
        elif server.isdigit():
            host, port = "127.0.0.1", server
        elif ":" not in server:
            host, port = server, str(DEFAULT_PORT)
        elif _is_ipv6(server):
            host, port = f"[{server}]", str(DEFAULT_PORT)
        else:
            host, _, port = server.rpartition(":")
        if not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
            where = "" if server == text.strip() else f" in {text!r}"
            raise ValueError(f"expected HOST[:PORT] (port 1-65535), got {server!r}{where}")
        servers.append(f"{host}:{int(port)}")
    return ",".join(servers)


def bootstrap_arg(text: str) -> str:
    """:func:`normalize_bootstrap` as an argparse ``type``: its error becomes argparse's one
    line naming the option."""
    try:
        return normalize_bootstrap(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def topic_prefix_arg(text: str) -> str:
    """:func:`~rewardstream.contract.names.check_topic_prefix` as an argparse ``type``."""
    try:
        return check_topic_prefix(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


KafkaFlag = Literal["--bootstrap", "--topic-prefix", "--group-id"]
_DECLARED: Final[dict[str, dict[str, Any]]] = {
    "--bootstrap": {"type": bootstrap_arg},
    "--topic-prefix": {"type": topic_prefix_arg, "default": DEFAULT_TOPIC_PREFIX},
    "--group-id": {"default": None},  # the readers and the processor take <prefix>-profiler
}


def add_option(
    parser: argparse.ArgumentParser, flag: KafkaFlag, help: str, *, required: bool = False
) -> None:
    """Declare ``flag`` on a command with the one type and default every command gives it, so
    a bootstrap list or a topic prefix is read and checked alike everywhere. ``help`` is the
    command's own: what the option means there (``with --bootstrap: ...``)."""
    parser.add_argument(flag, required=required, help=help, **_DECLARED[flag])


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True

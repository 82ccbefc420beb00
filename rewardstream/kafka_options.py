"""The ``--kafka-*`` command-line options of :mod:`rewardstream.kafka_config`.

Apart from it because building a command's parser must not import aiokafka and pydantic: every
``rewardstream`` command builds every parser, and start-up counts (``rewardstream snapshot``).
"""

from __future__ import annotations

import argparse

__all__ = ["ENV_PREFIX", "OPTIONS", "add_arguments"]

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
        "Kafka security", f"also from the environment: {ENV_PREFIX}<NAME> (see README)"
    )
    for field, text in OPTIONS.items():
        flag = "--kafka-" + field.replace("sasl_plain_", "sasl_").replace("_", "-")
        group.add_argument(flag, dest=f"kafka_{field}", default=None, help=text)

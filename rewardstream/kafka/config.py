"""Kafka connection security (SASL, TLS) for every aiokafka client rewardstream creates.

Why one module: the processor's consumers and producer, ``rewardstream publish`` and the
collector's live sink must all reach the same secured broker, so each builds its client from
:meth:`KafkaSecurity.client_kwargs` and starts it with :func:`start_client`; none can be left on
PLAINTEXT by accident, and a refused login is one line naming the setting to fix.

Settings come from ``REWARDSTREAM_KAFKA_<NAME>`` environment variables, where ``<NAME>`` is
aiokafka's own parameter name upper-cased (``REWARDSTREAM_KAFKA_SECURITY_PROTOCOL``,
``..._SASL_MECHANISM``, ``..._SASL_PLAIN_USERNAME``, ``..._SASL_PLAIN_PASSWORD``,
``..._SSL_CAFILE``, ``..._SSL_CERTFILE``, ``..._SSL_KEYFILE``, ``..._SSL_PASSWORD``), and from
``--kafka-*`` options, which win. Passwords are read from the environment only (a command
line is visible to every user in ``ps``) and held as :class:`~pydantic.SecretStr`, so no repr,
log line or error message ever shows them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.helpers import create_ssl_context
from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError, model_validator

from rewardstream.errors import InputError, KafkaUnreachable
from rewardstream.kafka.options import ENV_PREFIX, OPTIONS, add_arguments, normalize_bootstrap

__all__ = ["ENV_PREFIX", "KafkaSecurity", "add_arguments", "env_name", "from_args", "start_client"]

_PROBE_TIMEOUT_S = 10.0
_SASL_FIELDS = ("sasl_mechanism", "sasl_plain_username", "sasl_plain_password")
_SSL_FIELDS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password")

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


def env_name(field: str) -> str:
    """The environment variable of a setting: ``REWARDSTREAM_KAFKA_`` + its name upper-cased."""
    return ENV_PREFIX + field.upper()


class KafkaSecurity(BaseModel):
    """How to authenticate to and encrypt the connection with the brokers (aiokafka's names)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_password: SecretStr | None = None

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def mechanism(self) -> str:
        """The SASL mechanism in use (PLAIN unless set, as in aiokafka)."""
        return self.sasl_mechanism or "PLAIN"

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        """Refuse settings that would be silently ignored: credentials given but not used are
        a login the user believes happens."""
        proto = f"{env_name('security_protocol')}={self.security_protocol}"
        if not self.sasl:
            unused = [env_name(f) for f in _SASL_FIELDS if getattr(self, f) is not None]
            if unused:
                raise ValueError(f"{', '.join(unused)} set, but {proto} does not use SASL")
        else:
            missing = [
                env_name(f)
                for f in ("sasl_plain_username", "sasl_plain_password")
                if not getattr(self, f)
            ]
            if missing:
                raise ValueError(f"{proto} needs {' and '.join(missing)}")
        if not self.tls:
            unused = [env_name(f) for f in _SSL_FIELDS if getattr(self, f) is not None]
            if unused:
                raise ValueError(f"{', '.join(unused)} set, but {proto} does not use TLS")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError(f"{env_name('ssl_keyfile')} needs {env_name('ssl_certfile')}")
        return self

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: str | None
    ) -> KafkaSecurity:
        """Settings from ``REWARDSTREAM_KAFKA_*`` (empty means unset), then ``overrides`` (None
        means not given). Raises :class:`InputError` naming the variable at fault."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in cls.model_fields:
            value = env.get(env_name(field))
            if value:
                values[field] = value
        values |= {k: v for k, v in overrides.items() if v is not None}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]  # its "input" is never shown: it may be a password
            where = f"{env_name(str(err['loc'][0]))}: " if err["loc"] else ""
            msg = err["msg"].removeprefix("Value error, ")
            raise InputError(f"invalid Kafka security setting {where}{msg}") from None

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``AIOKafkaProducer``/``AIOKafkaConsumer``/``AIOKafkaAdminClient``
        (and ``aiokafka.conn.create_conn``); the SSL context is built here, from the files."""
        kwargs: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.sasl:
            assert self.sasl_plain_password is not None  # checked by the validator
            kwargs["sasl_mechanism"] = self.mechanism
            kwargs["sasl_plain_username"] = self.sasl_plain_username
            kwargs["sasl_plain_password"] = self.sasl_plain_password.get_secret_value()
        if self.tls:
            kwargs["ssl_context"] = self.ssl_context()
        return kwargs

    def ssl_context(self) -> ssl.SSLContext:
        """A verifying context (hostname checked) from the CA, certificate and key files; the
        system CAs when no CA file is given."""
        for field in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, field)
            if path is not None and not path.is_file():
                raise InputError(f"{env_name(field)}: no such file '{path}'")
        password = self.ssl_password.get_secret_value() if self.ssl_password else None
        try:
            context: ssl.SSLContext = create_ssl_context(
                cafile=self.ssl_cafile,
                certfile=self.ssl_certfile,
                keyfile=self.ssl_keyfile,
                password=password,
            )
        except ssl.SSLError as exc:
            raise InputError(
                f"cannot load the TLS files ({env_name('ssl_cafile')}, "
                f"{env_name('ssl_certfile')}, {env_name('ssl_keyfile')}, "
                f"{env_name('ssl_password')}): {exc.reason or exc}"
            ) from None
        return context

    def describe(self) -> str:
        """For logs: the protocol, mechanism and user, never a password."""
        if not self.sasl:
            return self.security_protocol
        return f"{self.security_protocol} ({self.mechanism}, user {self.sasl_plain_username})"


# --------------------------------------------------------------------------- command line


def from_args(args: argparse.Namespace) -> KafkaSecurity:
    """The settings of a command parsed with :func:`~rewardstream.kafka.options.add_arguments`
    (options over env)."""
    return KafkaSecurity.from_env(**{f: getattr(args, f"kafka_{f}", None) for f in OPTIONS})


# --------------------------------------------------------------------------- starting clients


class _Client(Protocol):
    async def start(self) -> None: ...


class _HeldBack(logging.Filter):
    """Holds aiokafka's ``Unable connect to "HOST:PORT"`` lines while a client starts: they
    reach stderr on their own (Python's last-resort handler) in front of the one-line error
    a failed start ends with, which says the same and more; a start that succeeds lets them
    through (one of several bootstrap servers is down). Only the bootstrap's lines (a quoted
    address): other clients' lines about nodes pass as they come."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith('Unable connect to "'):
            self.held.append(record)
            return False
        return True


async def start_client(client: _Client, bootstrap: str, security: KafkaSecurity) -> None:
    """Start an aiokafka client; a failed bootstrap becomes one :class:`InputError` line that
    says why (refused credentials, unknown mechanism, TLS, unreachable) and which setting to
    check. aiokafka itself only says "Unable to bootstrap"."""
    logger, held = logging.getLogger("aiokafka"), _HeldBack()  # its client logs here
    logger.addFilter(held)
    close = getattr(client, "stop", None) or getattr(client, "close", None)
    try:
        await client.start()
    except KafkaError:
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
        raise KafkaUnreachable(await _explain(bootstrap, security)) from None
    except BaseException:  # cancelled while starting (a shutdown): leave nothing open
        if close is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(close())
        raise
    finally:
        logger.removeFilter(held)
    for record in held.held:  # started: one bootstrap server of several was down
        logger.handle(record)


async def _explain(bootstrap: str, security: KafkaSecurity) -> str:
    """Connect once more to the first bootstrap server to learn why the client could not."""
    with contextlib.suppress(ValueError):  # as aiokafka read it: a host alone is on 9092
        bootstrap = normalize_bootstrap(bootstrap)
    where = f"Kafka at {bootstrap}"
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    try:
        conn = await asyncio.wait_for(
            create_conn(host.strip("[]"), int(port), **security.client_kwargs()),
            _PROBE_TIMEOUT_S,
        )
    except (SaslAuthenticationFailed, AuthenticationFailedError) as exc:
        user, pw = env_name("sasl_plain_username"), env_name("sasl_plain_password")
        return (
            f"{where} refused the SASL login of user {security.sasl_plain_username!r} "
            f"({security.mechanism}): {_reason(exc)}; check {user} and {pw}"
        )
    except UnsupportedSaslMechanismError as exc:
        return f"{where}: {_reason(exc)}; check {env_name('sasl_mechanism')}"
    except ssl.SSLError as exc:
        return (
            f"TLS with {where} failed: {exc.reason or exc}; check "
            f"{env_name('security_protocol')} and {env_name('ssl_cafile')}"
        )
    except (ConnectionRefusedError, TimeoutError, ValueError) as exc:
        return f"cannot reach {where}: {_reason(exc) or type(exc).__name__}"
    except (OSError, KafkaError) as exc:  # reset or closed: often the wrong protocol
        return f"cannot reach {where}: {_reason(exc) or type(exc).__name__}{_hint(security)}"
    conn.close()
    return f"{where} accepted a connection but not the client's requests{_hint(security)}"


def _hint(security: KafkaSecurity) -> str:
    return (
        f"; does the listener speak {security.security_protocol}? "
        f"(set {env_name('security_protocol')})"
    )


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]

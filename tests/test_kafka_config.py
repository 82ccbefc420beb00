"""The Kafka security settings: env and options, validation, client kwargs and the TLS context.

The live paths (a real SASL_PLAINTEXT and SSL listener) are in tests/test_security.py.
"""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest
from pydantic import SecretStr

from rewardstream.errors import InputError
from rewardstream.kafka.config import KafkaSecurity, add_arguments, from_args
from tests.tls import Certs, make_certs

SECRET = "pw-KafkaConfig-7f3a91"
SASL_ENV = {
    "REWARDSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "REWARDSTREAM_KAFKA_SASL_PLAIN_USERNAME": "alice",
    "REWARDSTREAM_KAFKA_SASL_PLAIN_PASSWORD": SECRET,
}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    made = make_certs(tmp_path_factory.mktemp("certs"))
    if made is None:
        pytest.skip("no openssl command to make test certificates")
    return made


def test_default_is_plaintext_with_no_extra_kwargs() -> None:
    assert KafkaSecurity.from_env({}).client_kwargs() == {"security_protocol": "PLAINTEXT"}


def test_sasl_from_env_gives_aiokafka_kwargs_and_never_shows_the_password() -> None:
    sec = KafkaSecurity.from_env(SASL_ENV)
    assert sec.client_kwargs() == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "alice",
        "sasl_plain_password": SECRET,
    }
    for shown in (
        repr(sec),
        str(sec),
        sec.model_dump_json(),
        str(sec.model_dump()),
        sec.describe(),
    ):
        assert SECRET not in shown
    assert sec.describe() == "SASL_PLAINTEXT (PLAIN, user alice)"


def test_options_win_over_env_and_empty_env_is_unset() -> None:
    env = SASL_ENV | {"REWARDSTREAM_KAFKA_SASL_MECHANISM": "", "REWARDSTREAM_KAFKA_SSL_CAFILE": ""}
    sec = KafkaSecurity.from_env(env, sasl_plain_username="bob", sasl_mechanism="SCRAM-SHA-512")
    kwargs = sec.client_kwargs()
    assert kwargs["sasl_plain_username"] == "bob"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"REWARDSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL"}, "REWARDSTREAM_KAFKA_SECURITY_PROTOCOL"),
        (
            {"REWARDSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"},
            "REWARDSTREAM_KAFKA_SASL_PLAIN_USERNAME and REWARDSTREAM_KAFKA_SASL_PLAIN_PASSWORD",
        ),
        (
            {k: v for k, v in SASL_ENV.items() if "PASSWORD" not in k},
            "needs REWARDSTREAM_KAFKA_SASL_PLAIN_PASSWORD",
        ),
        (  # credentials that would be silently ignored: the user believes they log in
            {"REWARDSTREAM_KAFKA_SASL_PLAIN_PASSWORD": SECRET},
            "REWARDSTREAM_KAFKA_SASL_PLAIN_PASSWORD set, but",
        ),
        (
            {"REWARDSTREAM_KAFKA_SSL_CAFILE": "/x.pem"},
            "REWARDSTREAM_KAFKA_SSL_CAFILE set, but REWARDSTREAM_KAFKA_SECURITY_PROTOCOL=PLAINTEXT",
        ),
        (
            {"REWARDSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL", "REWARDSTREAM_KAFKA_SSL_KEYFILE": "k"},
            "REWARDSTREAM_KAFKA_SSL_KEYFILE needs REWARDSTREAM_KAFKA_SSL_CERTFILE",
        ),
        (SASL_ENV | {"REWARDSTREAM_KAFKA_SASL_MECHANISM": "GSSAPI"}, "SASL_MECHANISM"),
        (SASL_ENV | {"REWARDSTREAM_KAFKA_BOGUS": "1"}, None),  # unknown variables are ignored
    ],
)
def test_bad_settings_are_one_line_naming_the_variable(
    env: dict[str, str], names: str | None
) -> None:
    if names is None:
        KafkaSecurity.from_env(env)
        return
    with pytest.raises(InputError) as err:
        KafkaSecurity.from_env(env)
    text = str(err.value)
    assert names in text and "\n" not in text and SECRET not in text
    assert text.startswith("invalid Kafka security setting")


def test_tls_context_verifies_the_broker_with_the_ca_file(certs: Certs) -> None:
    sec = KafkaSecurity(security_protocol="SSL", ssl_cafile=certs.ca)
    context = sec.client_kwargs()["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] == 1
    client = KafkaSecurity(
        security_protocol="SASL_SSL",
        sasl_plain_username="alice",
        sasl_plain_password=SecretStr(SECRET),
        ssl_cafile=certs.ca,
        ssl_certfile=certs.client_cert,
        ssl_keyfile=certs.client_key,
    ).client_kwargs()
    assert isinstance(client["ssl_context"], ssl.SSLContext)
    assert client["sasl_plain_password"] == SECRET


def test_tls_without_a_ca_file_uses_the_system_store() -> None:
    context = KafkaSecurity(security_protocol="SSL").ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_missing_or_broken_tls_files_name_the_variable(certs: Certs, tmp_path: Path) -> None:
    missing = KafkaSecurity(security_protocol="SSL", ssl_cafile=tmp_path / "nope.pem")
    with pytest.raises(InputError, match="REWARDSTREAM_KAFKA_SSL_CAFILE: no such file"):
        missing.client_kwargs()
    garbage = tmp_path / "garbage.pem"
    garbage.write_text(
        "-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n"
    )
    with pytest.raises(InputError, match="cannot load the TLS files"):
        KafkaSecurity(security_protocol="SSL", ssl_cafile=garbage).client_kwargs()
    mismatched = KafkaSecurity(  # the server's key with the client's certificate
        security_protocol="SSL", ssl_certfile=certs.client_cert, ssl_keyfile=certs.server_key
    )
    with pytest.raises(InputError, match="REWARDSTREAM_KAFKA_SSL_KEYFILE"):
        mismatched.client_kwargs()


def test_command_line_options_and_no_password_option(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    monkeypatch.setenv("REWARDSTREAM_KAFKA_SASL_PLAIN_PASSWORD", SECRET)
    args = parser.parse_args(
        ["--kafka-security-protocol", "SASL_SSL", "--kafka-sasl-username", "carol"]
    )
    sec = from_args(args)
    assert (sec.security_protocol, sec.sasl_plain_username) == ("SASL_SSL", "carol")
    assert sec.sasl_plain_password is not None
    assert sec.sasl_plain_password.get_secret_value() == SECRET
    options = parser.format_help()
    assert "--kafka-ssl-cafile" in options and "-password" not in options
    with pytest.raises(SystemExit):  # a password on a command line is visible in ps
        parser.parse_args(["--kafka-sasl-password", SECRET])

"""A broker secured as production clusters are: TLS from a test authority, SASL users.

``with SecuredBroker(workdir) as b:`` starts a single broker serving PLAINTEXT (for the
tests' own set-up), SASL_SSL with PLAIN and SCRAM users, and SSL that requires a client
certificate; every certificate is made here by trustme, as PEM files in ``workdir``.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Self

import trustme
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)
from cryptography.hazmat.primitives import serialization

from materializer.testing.kafka import KafkaBroker, SecureListeners

PLAIN_USERS = {"alice": "alice-secret"}
SCRAM_USERS = {
    "bob": ("SCRAM-SHA-256", "bob-secret"),
    "carol": ("SCRAM-SHA-512", "carol-secret"),
}
_MECHANISMS = {
    "SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256,
    "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512,
}


def _pkcs8(pem: bytes) -> bytes:
    """Kafka's Java PEM key store reads PKCS#8 keys only."""
    key = serialization.load_pem_private_key(pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class SecuredBroker:
    """The broker, the authority's certificate and a client certificate it accepts."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        authority = trustme.CA()
        server = authority.issue_cert("127.0.0.1", "localhost")
        client = authority.issue_cert("materializer-client")
        self.ca = workdir / "ca.pem"
        authority.cert_pem.write_to_path(str(self.ca))
        keystore = workdir / "broker.pem"
        keystore.write_bytes(
            _pkcs8(server.private_key_pem.bytes())
            + b"".join(pem.bytes() for pem in server.cert_chain_pems)
        )
        self.client_cert = workdir / "client-cert.pem"
        self.client_cert.write_bytes(b"".join(pem.bytes() for pem in client.cert_chain_pems))
        self.client_key = workdir / "client-key.pem"
        self.client_key.write_bytes(_pkcs8(client.private_key_pem.bytes()))
        self.listeners = SecureListeners(keystore, self.ca, PLAIN_USERS)
        self.broker = KafkaBroker(workdir / "broker", secure=self.listeners)

    @property
    def bootstrap_servers(self) -> str:
        """The PLAINTEXT listener, for the tests' own topics and records."""
        return self.broker.bootstrap_servers

    @property
    def sasl_bootstrap(self) -> str:
        """The SASL_SSL listener."""
        return f"127.0.0.1:{self.listeners.sasl_port}"

    @property
    def mtls_bootstrap(self) -> str:
        """The SSL listener that requires a client certificate."""
        return f"127.0.0.1:{self.listeners.mtls_port}"

    def start(self) -> Self:
        """Start the broker, then give the SCRAM users their passwords."""
        self.broker.start()
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        upserts: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(
                user, ScramCredentialInfo(_MECHANISMS[mechanism], 4096), password.encode()
            )
            for user, (mechanism, password) in SCRAM_USERS.items()
        ]
        for future in admin.alter_user_scram_credentials(upserts).values():
            future.result(30)
        return self

    def stop(self) -> None:
        """Stop the broker and remove its storage."""
        self.broker.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

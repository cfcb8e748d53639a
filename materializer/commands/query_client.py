"""How a command reaches a running query service over gRPC: its address, a token of
``query.auth``, and TLS as ``query.tls`` serves it.

Each option also reads an environment variable, so a token need not appear on a
command line (where ``ps`` and the shell's history would show it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from materializer.commands.cli_support import fail

if TYPE_CHECKING:
    from query_service.client import MaterializerClient

AddressOption = Annotated[
    str,
    typer.Option(
        "--address",
        envvar="MATERIALIZER_QUERY_ADDRESS",
        help="The query service's gRPC address (query.port).",
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="MATERIALIZER_TOKEN",
        help="A bearer token of query.auth; better given in the environment variable.",
        show_default=False,
    ),
]
TlsOption = Annotated[
    bool,
    typer.Option(
        "--tls/--no-tls",
        envvar="MATERIALIZER_QUERY_TLS",
        help="Connect over TLS (query.tls), trusting the system's CAs unless --ca-file.",
    ),
]
CaFileOption = Annotated[
    Path | None,
    typer.Option(
        "--ca-file",
        envvar="MATERIALIZER_QUERY_CA_FILE",
        help="PEM certificates to verify the service with; implies --tls.",
        show_default=False,
    ),
]
CertFileOption = Annotated[
    Path | None,
    typer.Option(
        "--cert-file",
        envvar="MATERIALIZER_QUERY_CERT_FILE",
        help="This client's PEM certificate, for a service asking for one "
        "(query.tls.client_ca_file); with --key-file.",
        show_default=False,
    ),
]
KeyFileOption = Annotated[
    Path | None,
    typer.Option(
        "--key-file",
        envvar="MATERIALIZER_QUERY_KEY_FILE",
        help="The private key of --cert-file (PEM).",
        show_default=False,
    ),
]


def _read(path: Path | None, option: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise fail(f"{option} {path}: cannot read: {exc.strerror}") from None


def query_client(
    address: str,
    token: str | None,
    tls: bool,
    ca_file: Path | None,
    cert_file: Path | None,
    key_file: Path | None,
    deadline: float,
) -> MaterializerClient:
    """A client of the service at ``address``; exits 2 when a TLS file cannot be read or
    a certificate comes without its key. Call inside the event loop that uses it."""
    import grpc

    from query_service.client import MaterializerClient

    if (cert_file is None) != (key_file is None):
        raise fail("--cert-file and --key-file: give both, or neither")
    credentials = None
    if tls or ca_file is not None or cert_file is not None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(ca_file, "--ca-file"),
            private_key=_read(key_file, "--key-file"),
            certificate_chain=_read(cert_file, "--cert-file"),
        )
    return MaterializerClient(address, token=token, credentials=credentials, deadline=deadline)

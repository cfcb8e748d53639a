"""``materializer sql``: one SELECT over the maps, asked of a running query service.

The statement runs where the query service runs it (``SqlService.Execute``), under
the same token checks and bounds as any other client's; the command prints its answer
and which version of each table it read, so a figure can be traced to the offsets
behind it. ``--format json`` is the HTTP front's JSON answer, so a script can take
either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import StrEnum
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from materializer.commands.cli_support import fail, out
from materializer.commands.query_client import (
    AddressOption,
    CaFileOption,
    CertFileOption,
    KeyFileOption,
    TlsOption,
    TokenOption,
    query_client,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from query_service.client import MaterializerClient, Offsets, SqlAnswer, TableRead


class Format(StrEnum):
    """How the answer is printed."""

    TABLE = "table"
    JSON = "json"
    CSV = "csv"


def _min_offsets(text: str) -> Offsets:
    """``topic:partition:offset,...`` (a topic name holds no colon)."""
    wanted: Offsets = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        topic, _, rest = part.rpartition(":")
        topic, _, partition = topic.rpartition(":")
        try:
            if not topic:
                raise ValueError
            wanted[(topic, int(partition))] = int(rest)
        except ValueError:
            raise fail(f"--min-offsets: {part!r} is not topic:partition:offset") from None
    return wanted


def _statement(text: str) -> str:
    if text != "-":
        return text
    return typer.get_text_stream("stdin").read()


async def _ask(
    connect: Callable[[], MaterializerClient],
    statement: str,
    params: list[Any],
    min_offsets: Offsets,
    limit: int,
) -> SqlAnswer:
    import grpc

    client = connect()
    try:
        return await client.sql(statement, params, min_offsets=min_offsets, limit=limit)
    except grpc.aio.AioRpcError as exc:
        raise fail(f"{exc.code().name}: {exc.details()}") from None
    finally:
        await client.close()


def _watermark_text(table: TableRead) -> str:
    mark = table.watermark
    if mark is None:
        return "no source offsets recorded"
    offsets = " ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(mark.offsets.items()))
    return f"watermark batch {mark.batch_id}: {offsets or 'no offsets'}"


def _read_line(table: TableRead) -> str:
    """The footer line of one table read: which copy, and the offsets behind it."""
    where = "the Redis copy" if table.redis else f"version {table.version}"
    return f"{table.map}: {where}, {_watermark_text(table)}"


def _print_table(answer: SqlAnswer) -> None:
    from query_service.sql_text import columns, text_of

    # Cells are data: as Text, their brackets and ``:name:`` are no markup or emoji.
    shown = Table(show_edge=True)
    data = answer.table
    for column in columns(data.schema):
        numeric = column["type"].startswith(("int", "uint", "float", "double", "decimal"))
        shown.add_column(Text(column["name"]), justify="right" if numeric else "left")
    for row in zip(*(c.to_pylist() for c in data.columns), strict=True):
        shown.add_row(*(Text("null", style="dim") if v is None else Text(text_of(v)) for v in row))
    out.print(shown)
    out.print(f"{data.num_rows} row{'' if data.num_rows == 1 else 's'}", highlight=False)
    for table in answer.tables:
        out.print(Text(_read_line(table)), soft_wrap=True)


def _print_json(answer: SqlAnswer) -> None:
    from query_service.sql_text import columns, dumps, rows, table_json

    data = answer.table
    body = {
        "columns": columns(data.schema),
        "rows": [row for batch in data.to_batches() for row in rows(batch)],
        "tables": [table_json(t) for t in answer.tables],
    }
    typer.echo(dumps(body).decode())


def _csv_ready(data: pa.Table) -> pa.Table:
    """Binary and nested columns as the text ``text_of`` gives them: Arrow's CSV writer
    takes no nested type, and would write bytes as they are."""
    import pyarrow as pa

    from query_service.sql_text import text_of

    binary = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary)
    for i, field in enumerate(data.schema):
        if pa.types.is_nested(field.type) or any(kind(field.type) for kind in binary):
            text = [None if v is None else text_of(v) for v in data.column(i).to_pylist()]
            data = data.set_column(
                i, pa.field(field.name, pa.string()), pa.array(text, pa.string())
            )
    return data


def _print_csv(answer: SqlAnswer) -> None:
    import pyarrow as pa
    from pyarrow import csv

    sink = pa.BufferOutputStream()
    csv.write_csv(_csv_ready(answer.table), sink)
    typer.echo(sink.getvalue().to_pybytes().decode(), nl=False)


def sql(
    statement: Annotated[
        str,
        typer.Argument(
            help="One SELECT or WITH statement; each map is a table by its name. -: stdin.",
            show_default=False,
        ),
    ],
    params: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            "-p",
            help="The value of $1, then $2, …: a number, true, false, null or a JSON "
            'string ("42" stays text); anything else is text.',
            show_default=False,
        ),
    ] = None,
    min_offsets: Annotated[
        str,
        typer.Option(
            "--min-offsets",
            help="topic:partition:offset,…: first wait until the tables reading these "
            "topics reflect these offsets (read-your-writes).",
            show_default=False,
        ),
    ] = "",
    limit: Annotated[
        int,
        typer.Option(
            min=0,
            help="Rows at most; the answer stops there. 0: up to the service's "
            "query.sql.max_rows, past which the statement fails.",
        ),
    ] = 0,
    timeout: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="Seconds the statement may take, a --min-offsets wait included; the "
            "service stops it past query.sql.timeout in any case.",
        ),
    ] = 30.0,
    output: Annotated[
        Format,
        typer.Option(
            "--format",
            case_sensitive=False,
            help="table: for reading, with the tables read below; json: the HTTP front's "
            "JSON answer; csv: a header, then the rows.",
        ),
    ] = Format.TABLE,
    address: AddressOption = "localhost:50051",
    token: TokenOption = None,
    tls: TlsOption = False,
    ca_file: CaFileOption = None,
    cert_file: CertFileOption = None,
    key_file: KeyFileOption = None,
) -> None:
    """Run one SELECT or WITH statement over the maps' tables on a query service and print
    its answer, with the version and source offsets of each table read.

    A statement the service refuses (not a SELECT, a map the token may not read, an
    unknown map, too many rows, too long) prints its status and message; exit 2.
    """
    from query_service.client import sql_param
    from query_service.sql_text import text_param

    values = [text_param(p) for p in params or []]
    for i, value in enumerate(values, 1):
        try:
            sql_param(value)
        except ValueError as exc:  # an integer past 64 bits
            raise fail(f"--param ${i}: {exc}") from None
    wanted = _min_offsets(min_offsets)
    connect = partial(query_client, address, token, tls, ca_file, cert_file, key_file, timeout)
    answer = asyncio.run(_ask(connect, _statement(statement), values, wanted, limit))
    {Format.TABLE: _print_table, Format.JSON: _print_json, Format.CSV: _print_csv}[output](answer)

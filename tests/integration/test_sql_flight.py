"""The Arrow Flight SQL port through ADBC's own Flight SQL driver, as users connect:
statements and bound parameters over Delta tables the test wrote, tokens and TLS, the
maps a token may see, and refusals and deadlines that leave the port answering."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest
import trustme
import yaml
from adbc_driver_flightsql import DatabaseOptions
from adbc_driver_manager import AdbcStatusCode
from adbc_driver_manager import Error as AdbcError
from deltalake import write_deltalake
from google.protobuf import any_pb2

from materializer.catalog.live import LiveMaps
from materializer.config import AppConfig, parse_config
from query_service.auth import Authorizer
from query_service.sql.executor import SqlExecutor
from query_service.sql.flight import FlightSqlPort, start_flight
from query_service.sql.flightsql import FlightSql_pb2 as fsql
from query_service.stores.delta import DeltaTables
from query_service.tables.snapshots import TableSnapshots

T = TypeVar("T")
READER = "reader-token-0123456789"
ADMIN = "admin-token-0123456789ab"
GETTER = "getter-token-0123456789"
TIERS = ("bronze", "silver", "gold", "platinum", "iron")
USERS = 1000
ORDERS = 100_000


class Maps:
    """The maps of one test module: names no other test uses, and the rows written."""

    def __init__(self, root: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.users, self.orders = f"users{tag}", f"orders{tag}"
        self.secret, self.empty = f"secret{tag}", f"empty{tag}"
        self.root = root
        self.user_rows = pa.table(
            {
                "_key": [f"u{i}" for i in range(USERS)],
                "tier": [TIERS[i % len(TIERS)] for i in range(USERS)],
                "n": pa.array(range(USERS), pa.int64()),
                "spend": [i * 1.5 for i in range(USERS)],
            }
        )
        self.order_rows = pa.table(
            {
                "_key": [f"o{i}" for i in range(ORDERS)],
                "user": [f"u{i % USERS}" for i in range(ORDERS)],
                "amount": pa.array([i % 97 for i in range(ORDERS)], pa.int64()),
            }
        )
        write_deltalake(str(root / self.users), self.user_rows)
        write_deltalake(str(root / self.orders), self.order_rows)
        write_deltalake(str(root / self.secret), pa.table({"_key": ["s1"], "code": ["42"]}))

    def config(self, **query: Any) -> AppConfig:
        source = {"source": {"topics": ["t"], "schema": "id STRING"}, "key": "id"}
        names = (self.users, self.orders, self.secret, self.empty)
        return parse_config(
            {
                "delta": {"root": str(self.root)},
                "query": query,
                "maps": dict.fromkeys(names, source),
            }
        )


async def generation(map_name: str) -> int:
    return 0


class Served:
    """A Flight SQL port over its own executor, on an event loop of its own thread, as the
    query service runs them; the test's ADBC calls block the test's thread."""

    def __init__(self, config: AppConfig, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.executor, self.flight = self.call(self._start(config, **options))
        self.port = self.flight.port

    @staticmethod
    async def _start(config: AppConfig, **options: Any) -> tuple[SqlExecutor, FlightSqlPort]:
        live = LiveMaps(config)
        snapshots = TableSnapshots(DeltaTables(live))
        executor = SqlExecutor(live, snapshots, generation)
        auth = Authorizer.from_config(config.query.auth) if config.query.auth else None
        flight = await start_flight(
            executor, live, snapshots, generation, auth, "127.0.0.1:0", **options
        )
        return executor, flight

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def running(self) -> int:
        async def running() -> int:
            return self.executor.running

        return self.call(running())

    def close(self) -> None:
        self.call(self.flight.close())  # a second close is harmless
        self.call(self.executor.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def maps(tmp_path_factory: pytest.TempPathFactory) -> Maps:
    return Maps(tmp_path_factory.mktemp("delta"))


@pytest.fixture(scope="module")
def served(maps: Maps, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Tokens on, statements bounded to 2 s and 150,000 rows."""
    tokens = tmp_path_factory.mktemp("auth") / "tokens.yaml"
    grants = [
        {"name": "reader", "token": READER, "maps": [maps.users, maps.orders], "verbs": ["query"]},
        {"name": "ops", "token": ADMIN, "maps": ["*"], "verbs": ["*"]},
        {"name": "getter", "token": GETTER, "maps": ["*"], "verbs": ["get"]},
    ]
    tokens.write_text(yaml.safe_dump({"tokens": grants}))
    server = Served(
        maps.config(auth={"tokens_file": str(tokens)}, sql={"timeout": "2s", "max_rows": 150_000})
    )
    yield server
    server.close()


def connect(port: int, token: str | None = None, scheme: str = "grpc", **options: str) -> Any:
    kwargs = dict(options)
    if token is not None:
        kwargs[DatabaseOptions.AUTHORIZATION_HEADER.value] = f"Bearer {token}"
    host = "localhost" if scheme == "grpc+tls" else "127.0.0.1"
    return flightsql.connect(f"{scheme}://{host}:{port}", db_kwargs=kwargs, autocommit=True)


def query(port: int, sql: str, params: tuple[Any, ...] | None = None, **kw: Any) -> pa.Table:
    with connect(port, **kw) as conn, conn.cursor() as cursor:
        cursor.execute(sql, parameters=params)
        table: pa.Table = cursor.fetch_arrow_table()
        return table


@dataclass
class Refusal:
    """An error as ADBC raises it: its message, ADBC's status, the service's own code."""

    message: str
    status: AdbcStatusCode
    code: str | None
    """From the ``x-materializer-status`` trailer; ``None`` for errors before a call."""


def refusal(call: Callable[[], object]) -> Refusal:
    with pytest.raises(AdbcError) as caught:
        call()
    error = caught.value
    details = {bytes(k): bytes(v) for k, v in error.details or ()}
    code = details.get(b"x-materializer-status")
    return Refusal(str(error), error.status_code, code.decode() if code else None)


def test_a_statement_answers_from_the_rows_written(served: Served, maps: Maps):
    answer = query(
        served.port,
        f"SELECT tier, count(*) AS users, sum(spend) AS spend FROM {maps.users} "
        "GROUP BY tier ORDER BY tier",
        token=READER,
    )

    expected = {}
    for row in maps.user_rows.to_pylist():
        count, spend = expected.get(row["tier"], (0, 0.0))
        expected[row["tier"]] = (count + 1, spend + row["spend"])
    assert answer.column_names == ["tier", "users", "spend"]
    assert [(r["tier"], r["users"], r["spend"]) for r in answer.to_pylist()] == [
        (tier, count, pytest.approx(spend)) for tier, (count, spend) in sorted(expected.items())
    ]


def test_bound_parameters_are_dollar_numbered(served: Served, maps: Maps):
    sql = f"SELECT _key, n FROM {maps.users} WHERE tier = $1 AND n < $2 ORDER BY n"

    answer = query(served.port, sql, ("gold", 40), token=READER)

    expected = [
        {"_key": r["_key"], "n": r["n"]}
        for r in maps.user_rows.to_pylist()
        if r["tier"] == "gold" and r["n"] < 40
    ]
    assert answer.to_pylist() == expected
    by_key = f"SELECT spend FROM {maps.users} WHERE _key = $1"
    assert query(served.port, by_key, ("u7",), token=READER).to_pylist() == [{"spend": 10.5}]
    question_mark = f"SELECT n FROM {maps.users} WHERE _key = ?"
    refused = refusal(lambda: query(served.port, question_mark, ("u7",), token=READER))
    assert refused.code == "INVALID_ARGUMENT"
    assert "INVALID_ARGUMENT: sql: parameter ?: parameters are $1, $2" in refused.message


def test_a_large_answer_streams_whole(served: Served, maps: Maps):
    answer = query(served.port, f"SELECT _key, amount FROM {maps.orders}", token=READER)

    assert answer.num_rows == ORDERS
    assert answer.to_batches()[0].num_rows < ORDERS  # streamed in batches, not one piece
    assert pc.sum(answer["amount"]).as_py() == pc.sum(maps.order_rows["amount"]).as_py()
    assert sorted(answer["_key"].to_pylist()) == sorted(maps.order_rows["_key"].to_pylist())


def test_every_call_needs_a_token_granted_query_and_the_maps_read(served: Served, maps: Maps):
    sql = f"SELECT count(*) FROM {maps.users}"

    no_token = refusal(lambda: query(served.port, sql))
    unknown = refusal(lambda: query(served.port, sql, token="x" * 20))
    no_verb = refusal(lambda: query(served.port, sql, token=GETTER))
    other_map = refusal(
        lambda: query(
            served.port,
            f"SELECT u._key FROM {maps.users} u JOIN {maps.secret} s ON u._key = s._key",
            token=READER,
        )
    )

    assert no_token.status == unknown.status == AdbcStatusCode.UNAUTHENTICATED
    assert "missing authorization metadata: send 'Bearer <token>'" in no_token.message
    assert "unknown token" in unknown.message
    assert no_verb.status == other_map.status == AdbcStatusCode.UNAUTHORIZED
    assert "token 'getter' may not run SQL (the verb 'query')" in no_verb.message
    assert f"token 'reader' may not use map '{maps.secret}'" in other_map.message
    assert other_map.code == "PERMISSION_DENIED"
    assert query(served.port, sql, token=READER).to_pylist() == [{"count(*)": USERS}]


def test_metadata_lists_only_the_maps_granted(served: Served, maps: Maps):
    def tables(token: str) -> dict[str, list[str]]:
        with connect(served.port, token) as conn:
            objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
        [catalog] = objects
        [schema] = catalog["catalog_db_schemas"]
        assert schema["db_schema_name"] == "public"
        return {
            t["table_name"]: [c["column_name"] for c in t["table_columns"]]
            for t in schema["db_schema_tables"]
        }

    assert tables(READER) == {
        maps.orders: ["_key", "user", "amount"],
        maps.users: ["_key", "tier", "n", "spend"],
    }
    everything = tables(ADMIN)
    assert sorted(everything) == sorted([maps.users, maps.orders, maps.secret, maps.empty])
    assert everything[maps.empty] == []  # declared, no table written yet
    with connect(served.port, READER) as conn:
        info = conn.adbc_get_info()
        types = conn.adbc_get_table_types()
    assert info["vendor_name"] == "Materializer"
    assert types == ["TABLE"]


def test_refusals_and_deadlines_leave_the_port_answering(served: Served, maps: Maps):
    ddl = refusal(lambda: query(served.port, "CREATE TABLE t (a INT)", token=ADMIN))
    too_many = refusal(
        lambda: query(served.port, f"SELECT a.n FROM {maps.users} a, {maps.users} b", token=ADMIN)
    )
    started = time.monotonic()
    slow = refusal(
        lambda: query(
            served.port,
            f"SELECT count(*) FROM {maps.users} a, {maps.users} b, {maps.users} c, "
            f"{maps.users} d WHERE (a.n + b.n + c.n + d.n) % 7 = 3",
            token=ADMIN,
        )
    )
    slow_seconds = time.monotonic() - started

    assert ddl.code == "INVALID_ARGUMENT"
    assert "INVALID_ARGUMENT: sql: CREATE TABLE statements are refused" in ddl.message
    assert too_many.code == "RESOURCE_EXHAUSTED"
    assert too_many.status == AdbcStatusCode.IO  # gRPC's UNAVAILABLE, as Arrow reads it
    assert "RESOURCE_EXHAUSTED: sql: the answer has more than 150000 rows" in too_many.message
    assert slow.code == "DEADLINE_EXCEEDED"
    assert slow.status == AdbcStatusCode.TIMEOUT
    assert "the statement ran longer than 2 s (query.sql.timeout)" in slow.message
    assert slow_seconds < 10
    assert query(served.port, f"SELECT count(*) AS n FROM {maps.users}", token=ADMIN)[
        "n"
    ].to_pylist() == [USERS]
    assert served.running() == 0


def test_the_clients_deadline_stops_its_statement(served: Served, maps: Maps):
    slow = (
        f"SELECT count(*) FROM {maps.users} a, {maps.users} b, {maps.users} c "
        "WHERE (a.n * b.n + c.n) % 11 = 5"
    )
    options = {DatabaseOptions.TIMEOUT_FETCH.value: "0.5"}
    started = time.monotonic()

    refused = refusal(lambda: query(served.port, slow, token=ADMIN, **options))

    assert refused.status == AdbcStatusCode.TIMEOUT
    assert refused.code is None  # the client gave up: the port never answered
    while served.running() and time.monotonic() - started < 5:
        time.sleep(0.02)
    assert served.running() == 0
    assert time.monotonic() - started < 1.5  # well before the port's own 2 s bound
    assert query(served.port, f"SELECT min(n) AS n FROM {maps.users}", token=ADMIN)[
        "n"
    ].to_pylist() == [0]


def flight_call(token: str) -> fl.FlightCallOptions:
    return fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])


def packed(message: Any) -> bytes:
    command = any_pb2.Any()
    command.Pack(message)
    return command.SerializeToString()


def test_a_prepared_statement_takes_its_parameters_by_do_put(served: Served, maps: Maps):
    """The protocol's own steps, as the JDBC driver takes them: the schemas a client is told
    at prepare (an answer's once its text ran), parameters bound by ``DoPut``, then run."""
    client = fl.connect(f"grpc://127.0.0.1:{served.port}")
    text = f"SELECT _key, spend FROM {maps.users} WHERE _key = $1 AND n < $2"

    def prepare() -> Any:
        request = fsql.ActionCreatePreparedStatementRequest(query=text)
        [result] = client.do_action(
            fl.Action("CreatePreparedStatement", packed(request)), flight_call(READER)
        )
        created = fsql.ActionCreatePreparedStatementResult()
        any_pb2.Any.FromString(result.body.to_pybytes()).Unpack(created)
        return created

    def schema(message: bytes) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(message))

    created = prepare()
    command = fsql.CommandPreparedStatementQuery(
        prepared_statement_handle=created.prepared_statement_handle
    )
    descriptor = fl.FlightDescriptor.for_command(packed(command))
    writer, _ = client.do_put(
        descriptor, pa.schema({"a": pa.string(), "b": pa.int64()}), flight_call(READER)
    )
    writer.write_table(pa.table({"a": ["u3"], "b": [10]}))
    writer.close()
    info = client.get_flight_info(descriptor, flight_call(READER))
    answer = client.do_get(info.endpoints[0].ticket, flight_call(READER)).read_all()

    assert schema(created.parameter_schema) == pa.schema({"$1": pa.string(), "$2": pa.string()})
    assert schema(created.dataset_schema).names == ["unknown"]  # before the text first ran
    assert not created.is_update
    assert answer.to_pylist() == [{"_key": "u3", "spend": 4.5}]
    assert schema(prepare().dataset_schema) == answer.schema
    client.close()


def test_an_answer_is_read_once_by_the_token_that_ran_it(served: Served, maps: Maps):
    client = fl.connect(f"grpc://127.0.0.1:{served.port}")
    command = fsql.CommandStatementQuery(query=f"SELECT n FROM {maps.users} WHERE n < 3")
    descriptor = fl.FlightDescriptor.for_command(packed(command))
    info = client.get_flight_info(descriptor, flight_call(READER))
    ticket = info.endpoints[0].ticket

    with pytest.raises(fl.FlightError, match="NOT_FOUND: no answer waits under this ticket"):
        client.do_get(ticket, flight_call(ADMIN)).read_all()
    assert client.do_get(ticket, flight_call(READER)).read_all()["n"].to_pylist() == [0, 1, 2]
    with pytest.raises(fl.FlightError, match="NOT_FOUND: no answer waits under this ticket"):
        client.do_get(ticket, flight_call(READER)).read_all()
    assert info.schema == pa.schema([pa.field("n", pa.int64())])
    client.close()


def test_an_answer_nobody_reads_frees_its_statement_process(maps: Maps):
    server = Served(maps.config(), unread_seconds=0.5)
    client = fl.connect(f"grpc://127.0.0.1:{server.port}")
    command = fsql.CommandStatementQuery(query=f"SELECT n FROM {maps.users}")
    try:
        info = client.get_flight_info(fl.FlightDescriptor.for_command(packed(command)))
        assert server.running() == 1  # the answer holds its process, waiting for its reader
        time.sleep(1)
        running = server.running()
        with pytest.raises(fl.FlightError, match="not read within 0.5 s of its statement"):
            client.do_get(info.endpoints[0].ticket).read_all()
    finally:
        client.close()
        server.close()

    assert running == 0


def test_closing_the_port_stops_the_statements_it_runs(maps: Maps):
    server = Served(maps.config())  # no query.auth: no token needed
    slow = (
        f"SELECT count(*) FROM {maps.users} a, {maps.users} b, {maps.users} c "
        "WHERE (a.n * b.n + c.n) % 13 = 5"
    )
    client = fl.connect(f"grpc://127.0.0.1:{server.port}")
    descriptor = fl.FlightDescriptor.for_command(packed(fsql.CommandStatementQuery(query=slow)))
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            info = client.get_flight_info(descriptor)
            client.do_get(info.endpoints[0].ticket).read_all()
        except fl.FlightError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read)
    try:
        reader.start()
        while not server.running():
            time.sleep(0.02)
        started = time.monotonic()
        server.call(server.flight.close())
        reader.join(10)
        assert time.monotonic() - started < 5
    finally:
        server.close()
        client.close()

    [error] = outcome
    assert isinstance(error, fl.FlightUnavailableError)
    assert "the query service is stopping" in str(error)
    assert server.executor.running == 0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    ca = trustme.CA()
    root = tmp_path_factory.mktemp("pki")
    server = ca.issue_cert("localhost")
    client = ca.issue_cert("analyst")
    files = {"ca": root / "ca.pem", "cert": root / "server.pem", "key": root / "server.key"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    return {
        "files": files,
        "ca": ca.cert_pem.bytes().decode(),
        "client_cert": client.cert_chain_pems[0].bytes().decode(),
        "client_key": client.private_key_pem.bytes().decode(),
    }


def test_tls_and_mutual_tls_as_on_the_grpc_port(maps: Maps, pki: dict[str, Any]):
    files = pki["files"]
    tls = {"cert_file": str(files["cert"]), "key_file": str(files["key"])}
    sql = f"SELECT count(*) AS n FROM {maps.users}"
    trusting = {DatabaseOptions.TLS_ROOT_CERTS.value: pki["ca"]}
    untrusting = {DatabaseOptions.TLS_ROOT_CERTS.value: trustme.CA().cert_pem.bytes().decode()}
    with_cert = {
        **trusting,
        DatabaseOptions.MTLS_CERT_CHAIN.value: pki["client_cert"],
        DatabaseOptions.MTLS_PRIVATE_KEY.value: pki["client_key"],
    }

    server = Served(maps.config(tls=tls))  # no query.auth: the port is open
    try:
        assert query(server.port, sql, scheme="grpc+tls", **trusting)["n"].to_pylist() == [USERS]
        refusal(lambda: query(server.port, sql, scheme="grpc+tls", **untrusting))
        refusal(lambda: query(server.port, sql))  # plaintext to a TLS port
    finally:
        server.close()

    server = Served(maps.config(tls={**tls, "client_ca_file": str(files["ca"])}))
    try:
        assert query(server.port, sql, scheme="grpc+tls", **with_cert)["n"].to_pylist() == [USERS]
        refusal(lambda: query(server.port, sql, scheme="grpc+tls", **trusting))  # no client cert
    finally:
        server.close()

"""Maps as resources through the query service (HTTP and gRPC) and ``materializer maps``, on
a real broker's catalog topic: checks before anything is stored, versions, the ``manage``
verb, and the rule that the file owns its maps."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import yaml

from materializer.catalog.store import CatalogTopic
from materializer.config import AppConfig, parse_config
from materializer.contract.map_catalog import StoredMap
from materializer.v1 import admin_service_pb2 as pb
from materializer.v1 import admin_service_pb2_grpc as pb_grpc
from tests.helpers.query_redis import Front, serve_http
from tests.helpers.slices import SCHEMA

MANAGER = "manager-token-0123456789"
READER = "reader-token-0123456789"


def section(topic: str, **extra: Any) -> dict[str, Any]:
    return {"source": {"topics": [topic], "schema": SCHEMA}, "key": "id", **extra}


def catalog_doc(
    kafka: str, redis_url: str, tmp: Path, file_topic: str, **query: Any
) -> dict[str, Any]:
    """One map in the file, and a catalog topic of the test's own."""
    return {
        "kafka": {"bootstrap_servers": kafka},
        "redis": {"url": redis_url},
        "delta": {"root": str(tmp / "warehouse")},
        "spark": {"checkpoint_root": str(tmp / "checkpoints")},
        "catalog": {"topic": f"maps-{uuid.uuid4().hex[:10]}", "poll_interval": "200 ms"},
        "query": query,
        "maps": {"filed": section(file_topic)},
    }


def stored(cfg: AppConfig) -> dict[str, Any]:
    """What the catalog topic holds, read as a new process would."""
    topic = CatalogTopic(cfg.kafka, cfg.catalog)
    try:
        return {name: r.config for name, r in topic.read().items()}
    finally:
        topic.close()


def test_create_read_change_delete_over_http_with_versions_and_the_file_untouched(
    kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    orders, more = new_topic(1), new_topic(1)
    cfg = parse_config(catalog_doc(kafka_bootstrap, redis_url, tmp_path, new_topic(1)))

    async def body(f: Front) -> None:
        listed = await f.json("GET", "/v1/maps")
        assert [(m["name"], m["origin"], m["version"]) for m in listed["maps"]] == [
            ("filed", "file", "0")
        ]
        created = await f.json(
            "POST", "/v1/maps", status=201, json={"name": "orders", "config": section(orders)}
        )
        assert created["config"] == section(orders)
        assert (created["origin"], created["version"], created["created"]) == ("api", 1, True)
        assert created["changed_by"] == "anonymous" and created["changed_at"]
        await f.json(
            "POST", "/v1/maps", status=409, json={"name": "orders", "config": section(orders)}
        )
        assert await f.json("GET", "/v1/maps/orders/config") == section(orders)
        # PUT is create-or-update; a change of what the state does not depend on passes.
        changed = await f.json(
            "PUT", "/v1/maps/orders/config", json=section(orders, history=True, on_error="skip")
        )
        assert (changed["version"], changed["created"], changed["rebuilding"]) == (2, False, False)
        changed = await f.json(
            "PUT",
            "/v1/maps/orders/config",
            json={**section(orders), "source": {"topics": [orders, more], "schema": SCHEMA}},
        )
        assert changed["version"] == 3
        put_new = await f.json("PUT", "/v1/maps/second/config", json=section(more))
        assert (put_new["version"], put_new["created"]) == (1, True)
        names = {
            m["name"]: (m["origin"], m["version"])
            for m in (await f.json("GET", "/v1/maps"))["maps"]
        }
        assert names == {"filed": ("file", "0"), "orders": ("api", "3"), "second": ("api", "1")}
        # The file's section, as a section to put elsewhere.
        assert await f.json("GET", "/v1/maps/filed/config") == {
            "source": {"topics": cfg.maps["filed"].source.topics, "schema": SCHEMA},
            "key": "id",
        }

        deleted = await f.json("DELETE", "/v1/maps/second")
        assert deleted == {"name": "second", "version": 2, "purged": []}
        await f.json("GET", "/v1/maps/second/config", status=404)
        await f.json("DELETE", "/v1/maps/second", status=404)
        again = await f.json("PUT", "/v1/maps/second/config", json=section(more))
        assert again["version"] == 3  # a map created again goes on counting

    serve_http(cfg, body)
    assert stored(cfg) == {
        "orders": {"source": {"topics": [orders, more], "schema": SCHEMA}, "key": "id"},
        "second": section(more),
    }


def test_bad_changes_name_every_key_path_and_store_nothing(
    kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    orders = new_topic(1)
    cfg = parse_config(catalog_doc(kafka_bootstrap, redis_url, tmp_path, new_topic(1)))
    bad = {"source": {"topics": [orders], "format": "xml"}, "fold": {"mode": "fold"}, "typo": 1}

    async def body(f: Front) -> None:
        error = await f.json("POST", "/v1/maps", status=400, json={"name": "orders", "config": bad})
        for path in (
            "maps.orders.source.format",
            "maps.orders.fold.mode",
            "maps.orders.typo",
            "maps.orders.key",
        ):
            assert path in error["error"]["message"], error
        # What only the running system can say: a topic that does not exist.
        error = await f.json(
            "PUT",
            "/v1/maps/orders/config",
            status=400,
            json=section("no-such-topic-" + uuid.uuid4().hex),
        )
        assert "maps.orders.source.topics.0: no topic" in error["error"]["message"]
        # Malformed requests.
        error = await f.json("POST", "/v1/maps", status=400, json={"name": "a b", "config": {}})
        assert error["error"]["message"].startswith("name:")
        error = await f.json("PUT", "/v1/maps/orders/config", status=400, data=b"[1]")
        assert "must be a JSON object" in error["error"]["message"]
        # The file owns its maps.
        error = await f.json("PUT", "/v1/maps/filed/config", status=400, json=section(orders))
        assert "declared in the configuration file" in error["error"]["message"]
        await f.json("DELETE", "/v1/maps/filed", status=400)

        # A change the state cannot follow names the way out, and is stored only when asked.
        await f.json("PUT", "/v1/maps/orders/config", json=section(orders))
        refused = await f.json(
            "PUT",
            "/v1/maps/orders/config",
            status=400,
            json=section(orders, fold={"mode": "merge"}),
        )
        assert (
            "fold.mode" in refused["error"]["message"]
            and "?rebuild=true" in refused["error"]["message"]
        )
        assert await f.json("GET", "/v1/maps/orders/config") == section(orders)
        rebuilt = await f.json(
            "PUT",
            "/v1/maps/orders/config?rebuild=true",
            json=section(orders, fold={"mode": "merge"}),
        )
        assert (rebuilt["version"], rebuilt["rebuilding"]) == (2, True)

    serve_http(cfg, body)
    assert stored(cfg) == {"orders": section(orders, fold={"mode": "merge"})}


def test_managing_maps_takes_the_manage_verb_and_is_logged_with_the_token(
    kafka_bootstrap, redis_url, new_topic, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    orders = new_topic(1)
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump(
            {
                "tokens": [
                    {
                        "name": "ops-bot",
                        "token": MANAGER,
                        "maps": ["*"],
                        "verbs": ["manage", "status"],
                    },
                    {
                        "name": "dashboard",
                        "token": READER,
                        "maps": ["*"],
                        "verbs": ["status", "control"],
                    },
                ]
            }
        )
    )
    doc = catalog_doc(
        kafka_bootstrap, redis_url, tmp_path, new_topic(1), auth={"tokens_file": str(tokens)}
    )
    cfg = parse_config(doc)

    def bearer(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    async def body(f: Front) -> None:
        new = {"name": "orders", "config": section(orders)}
        await f.json("POST", "/v1/maps", status=401, json=new)
        await f.json("POST", "/v1/maps", status=403, json=new, headers=bearer(READER))
        made = await f.json("POST", "/v1/maps", status=201, json=new, headers=bearer(MANAGER))
        assert made["changed_by"] == "ops-bot"
        assert await f.json("GET", "/v1/maps/orders/config", headers=bearer(READER)) == section(
            orders
        )
        await f.json("DELETE", "/v1/maps/orders", status=403, headers=bearer(READER))

        # gRPC: the same calls, the same verb.
        admin = pb_grpc.AdminServiceStub(f.channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await admin.DeleteMap(
                pb.DeleteMapRequest(map="orders"), metadata=[("authorization", f"Bearer {READER}")]
            )
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        manager = [("authorization", f"Bearer {MANAGER}")]
        put = await admin.PutMapConfig(
            pb.PutMapRequest(
                map="orders", config_json=orjson.dumps(section(orders, history=True)).decode()
            ),
            metadata=manager,
        )
        assert (put.version, put.origin, put.changed_by) == (2, "api", "ops-bot")
        got = await admin.GetMapConfig(pb.GetMapConfigRequest(map="orders"), metadata=manager)
        assert orjson.loads(got.config_json) == section(orders, history=True)
        with pytest.raises(grpc.aio.AioRpcError) as exists:
            await admin.CreateMap(
                pb.PutMapRequest(map="orders", config_json="{}"), metadata=manager
            )
        assert exists.value.code() == grpc.StatusCode.ALREADY_EXISTS
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            await admin.PutMapConfig(
                pb.PutMapRequest(map="orders", config_json="{"), metadata=manager
            )
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        deleted = await admin.DeleteMap(pb.DeleteMapRequest(map="orders"), metadata=manager)
        assert deleted.version == 3

    with caplog.at_level("INFO", logger="query_service"):
        serve_http(cfg, body)
    said = [r.getMessage() for r in caplog.records]
    assert "map orders created by ops-bot (version 1)" in said
    assert "map orders changed by ops-bot (version 2)" in said
    assert "map orders deleted by ops-bot (version 3)" in said


def test_the_cli_applies_gets_and_deletes_and_a_file_map_shadows_the_catalog(
    kafka_bootstrap, redis_url, new_topic, tmp_path: Path
):
    orders, filed_topic = new_topic(1), new_topic(1)
    doc = catalog_doc(kafka_bootstrap, redis_url, tmp_path, filed_topic)
    config_file = tmp_path / "materializer.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    maps_file = tmp_path / "maps.yaml"
    maps_file.write_text(
        yaml.safe_dump({"maps": {"orders": section(orders), "filed": section(orders)}})
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "materializer", "maps", *args, "-c", str(config_file)],
            capture_output=True,
            text=True,
            timeout=120,
        )

    refused = cli("apply", "-f", str(maps_file))
    assert refused.returncode == 2 and "declared in the configuration file" in refused.stderr
    assert stored(parse_config(doc)) == {}  # nothing of a refused document is stored
    # Two maps of one document are checked together: a changelog both claim is refused.
    shared = {"changelog": {"topic": "shared.changelog"}}
    clash = {"a1": section(orders, **shared), "a2": section(orders, **shared)}
    maps_file.write_text(yaml.safe_dump({"maps": clash}))
    refused = cli("apply", "-f", str(maps_file))
    assert refused.returncode == 2 and "maps.a2.changelog.topic" in refused.stderr, refused.stderr
    assert stored(parse_config(doc)) == {}

    maps_file.write_text(yaml.safe_dump({"name": "orders", "config": section(orders)}))
    applied = cli("apply", "-f", str(maps_file))
    assert applied.returncode == 0, applied.stderr
    assert "map orders created (version 1)" in applied.stdout
    got = cli("get", "orders")
    assert yaml.safe_load(got.stdout) == {"name": "orders", "config": section(orders)}
    listing = cli("get")
    assert "orders" in listing.stdout and "filed" in listing.stdout and "cli:" in listing.stdout

    # The same name in the catalog and in the file: the file's definition is in force.
    catalog = CatalogTopic(parse_config(doc).kafka, parse_config(doc).catalog)
    catalog.write(StoredMap("filed", 1, section(orders), "someone"))
    catalog.close()
    shadowed = cli("get", "filed")
    assert yaml.safe_load(shadowed.stdout)["config"]["source"]["topics"] == [filed_topic]
    assert (
        "filed: not in force: maps.filed: the configuration file declares this map"
        in cli("get").stderr
    )

    deleted = cli("delete", "orders", "--purge")
    assert deleted.returncode == 0, deleted.stderr
    assert "map orders deleted (version 2)" in deleted.stdout
    assert cli("get", "orders").returncode == 2

"""The one ``object_store`` block as Spark's S3A client and delta-rs name it."""

from __future__ import annotations

import pytest

from materializer.clients.object_store import delta_rs_location, hadoop_conf
from materializer.config import ObjectStoreConfig, SparkConfig, parse_config
from materializer.errors import ConfigError
from materializer.spark.session import spark_conf

STORE = {
    "endpoint": "http://s3.local:9000",
    "path_style": True,
    "access_key_id": {"env": "TEST_KEY_ID"},
    "secret_access_key": {"value": "s3cret"},
}


def lake(**store: object) -> dict[str, object]:
    return {
        "delta": {"root": "s3a://lake/warehouse"},
        "spark": {"checkpoint_root": "s3a://lake/checkpoints"},
        "object_store": store,
    }


def test_both_sides_reach_the_same_bucket_with_the_same_keys(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TEST_KEY_ID", "id-1")
    cfg = parse_config(lake(**STORE))
    assert cfg.object_store is not None
    assert hadoop_conf(cfg.object_store) == {
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.endpoint": "http://s3.local:9000",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.aws.credentials.provider": (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        ),
        "spark.hadoop.fs.s3a.access.key": "id-1",
        "spark.hadoop.fs.s3a.secret.key": "s3cret",
    }
    uri, options = delta_rs_location(cfg, "s3a://lake/warehouse/users")
    assert uri == "s3://lake/warehouse/users"
    assert options == {
        "AWS_REGION": "us-east-1",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ENDPOINT_URL": "http://s3.local:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "id-1",
        "AWS_SECRET_ACCESS_KEY": "s3cret",
    }
    assert "s3cret" not in repr(cfg)


def test_aws_defaults_leave_keys_to_the_environment():
    cfg = parse_config(lake())
    assert cfg.object_store is not None
    assert "spark.hadoop.fs.s3a.access.key" not in hadoop_conf(cfg.object_store)
    assert delta_rs_location(cfg, "s3a://lake/t")[1] == {
        "AWS_REGION": "us-east-1",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true",
    }
    assert delta_rs_location(parse_config({}), "./warehouse/t") == ("./warehouse/t", None)


def test_the_s3_jars_join_a_session_only_with_an_object_store():
    plain = spark_conf(SparkConfig())["spark.driver.extraClassPath"]
    with_store = spark_conf(SparkConfig(), ObjectStoreConfig())["spark.driver.extraClassPath"]
    assert "hadoop-aws" not in plain and "hadoop-aws" in with_store


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"delta": {"root": "s3a://lake/w"}}, "delta.root: s3a://lake/w is in an object store"),
        (
            {"spark": {"checkpoint_root": "s3a://lake/c"}},
            "spark.checkpoint_root: s3a://lake/c is in an object store",
        ),
        ({**lake(), "delta": {"root": "s3://lake/w"}}, "delta.root: write s3a://"),
        (lake(access_key_id="k"), "object_store: access_key_id and secret_access_key go together"),
        (lake(endpoint="s3.local:9000"), "object_store.endpoint"),
    ],
)
def test_bad_object_store_settings_name_their_key(doc: dict[str, object], problem: str):
    with pytest.raises(ConfigError) as bad:
        parse_config(doc)
    assert problem in str(bad.value)

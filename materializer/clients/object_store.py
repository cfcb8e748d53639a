"""The ``object_store`` settings as each reader and writer of the tables names them.

Spark writes the tables and checkpoints through Hadoop's S3A client (``s3a://``);
the query service, ``rehydrate`` and ``verify`` read the tables through delta-rs
(``s3://``, storage options). Both are derived here from one config block, so the
two sides can never look at different buckets or with different credentials.

A table has one writer: the map's Delta query in ``materializer run``. Delta's
default log store for S3 commits by "put if absent" from that single driver, so
two runs must never write one table (the chart runs one driver pod).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from materializer.config import OBJECT_STORE_SCHEMES, AppConfig, ObjectStoreConfig

if TYPE_CHECKING:
    import pyarrow.fs as pafs

_SIMPLE_CREDENTIALS = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"


def hadoop_conf(store: ObjectStoreConfig) -> dict[str, str]:
    """``spark.hadoop.fs.s3a.*`` settings (Spark keeps ``secret`` keys out of its logs)."""
    conf = {
        "spark.hadoop.fs.s3a.endpoint.region": store.region,
        "spark.hadoop.fs.s3a.path.style.access": str(store.path_style).lower(),
    }
    if store.endpoint is not None:
        conf["spark.hadoop.fs.s3a.endpoint"] = store.endpoint
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            store.endpoint.startswith("https://")
        ).lower()
    if store.access_key_id is not None and store.secret_access_key is not None:
        conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = _SIMPLE_CREDENTIALS
        conf["spark.hadoop.fs.s3a.access.key"] = store.access_key_id.reveal(
            "object_store.access_key_id"
        )
        conf["spark.hadoop.fs.s3a.secret.key"] = store.secret_access_key.reveal(
            "object_store.secret_access_key"
        )
    return conf


def delta_rs_location(config: AppConfig, path: str) -> tuple[str, dict[str, str] | None]:
    """A table's URI and storage options for delta-rs; a local path is returned as it is."""
    store = config.object_store
    if store is None or not path.startswith(OBJECT_STORE_SCHEMES):
        return path, None
    options = {
        "AWS_REGION": store.region,
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not store.path_style).lower(),
    }
    if store.endpoint is not None:
        options["AWS_ENDPOINT_URL"] = store.endpoint
        options["AWS_ALLOW_HTTP"] = str(store.endpoint.startswith("http://")).lower()
    if store.access_key_id is not None and store.secret_access_key is not None:
        options["AWS_ACCESS_KEY_ID"] = store.access_key_id.reveal("object_store.access_key_id")
        options["AWS_SECRET_ACCESS_KEY"] = store.secret_access_key.reveal(
            "object_store.secret_access_key"
        )
    return "s3://" + path.split("://", 1)[1], options


def arrow_filesystem(store: ObjectStoreConfig, location: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's S3 file system and the bucket path, for files beside the tables (the
    streaming queries' checkpoints) that ``rehydrate`` and ``reset-offsets`` read."""
    import pyarrow.fs as pafs

    options: dict[str, Any] = {
        "region": store.region,
        "force_virtual_addressing": not store.path_style,
    }
    if store.endpoint is not None:
        scheme, _, host = store.endpoint.partition("://")
        options["endpoint_override"] = host.rstrip("/")
        options["scheme"] = scheme
    if store.access_key_id is not None and store.secret_access_key is not None:
        options["access_key"] = store.access_key_id.reveal("object_store.access_key_id")
        options["secret_key"] = store.secret_access_key.reveal("object_store.secret_access_key")
    return pafs.S3FileSystem(**options), location.split("://", 1)[1].rstrip("/")

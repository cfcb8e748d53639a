"""The JVM jars and the Python packages must carry the same Spark and Delta versions."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

import pyspark

from materializer.config import ObjectStoreConfig, SparkConfig
from materializer.jvm import jars
from materializer.spark.session import spark_conf

ROOT = Path(__file__).resolve().parents[2]
NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def _property(name: str) -> str:
    tree = ET.parse(ROOT / "jvm" / "pom.xml")
    node = tree.find(f"m:properties/m:{name}", NS)
    assert node is not None and node.text
    return node.text


def _artifact(jar: str) -> str:
    """A jar's artifact name without its version (``jackson-core-2.13.5.jar``: ``jackson-core``)."""
    return re.sub(r"-\d[\w.-]*\.jar$", "", jar)


def test_pom_versions_match_installed_python_packages():
    assert _property("spark.version") == version("pyspark")
    assert _property("delta.version") == version("delta-spark")


def test_resolved_jars_carry_the_pinned_versions():
    names = [p.name for p in jars("spark")]
    spark_version, delta_version = version("pyspark"), version("delta-spark")
    assert f"spark-sql-kafka-0-10_2.13-{spark_version}.jar" in names
    assert f"spark-avro_2.13-{spark_version}.jar" in names
    line = ".".join(spark_version.split(".")[:2])
    assert f"delta-spark_{line}_2.13-{delta_version}.jar" in names
    # pyspark ships Scala, Hadoop, Jackson, Parquet... itself; a second copy of any of
    # them, at another version, on the classpath breaks Spark.
    bundled = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    assert not [n for n in names if _artifact(n) in bundled]
    kafka = [p.name for p in jars("kafka")]
    assert f"kafka_2.13-{_property('kafka.version')}.jar" in kafka


def test_session_conf_uses_local_jars_and_delta():
    conf = spark_conf(SparkConfig())
    # A local master's executors are the driver's JVM: the jars are on its class path.
    assert all(Path(j).is_file() for j in conf["spark.driver.extraClassPath"].split(":"))
    assert "spark.jars" not in conf
    assert "spark.jars.packages" not in conf
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.sql.catalog.spark_catalog"].endswith("DeltaCatalog")
    assert not [key for key in conf if key.startswith("spark.sql.streaming.stateStore.")]
    assert spark_conf(SparkConfig(conf={"spark.ui.enabled": "true"}))["spark.ui.enabled"] == "true"


def test_installed_jars_go_on_the_class_paths_instead_of_being_shipped():
    shipped = spark_conf(SparkConfig(master="spark://cluster:7077"))
    installed = spark_conf(SparkConfig(jars="installed"), ObjectStoreConfig())
    assert "spark.jars" not in installed
    path = installed["spark.driver.extraClassPath"].split(":")
    assert installed["spark.executor.extraClassPath"] == installed["spark.driver.extraClassPath"]
    # The same jars as shipping sends, and the S3 jars with an object store.
    assert set(shipped["spark.jars"].split(",")) < set(path)
    assert {str(p) for p in jars("s3")} <= set(path)
    assert all(Path(j).is_file() for j in path)
    assert "spark.executor.extraClassPath" not in shipped
    assert shipped["spark.driver.extraClassPath"] == ":".join(shipped["spark.jars"].split(","))
    # A class path of the config's own is added to the product's jars, not put in their place.
    own = {"spark.executor.extraClassPath": "/opt/extra/udf.jar"}
    extended = spark_conf(SparkConfig(jars="installed", conf=own))["spark.executor.extraClassPath"]
    assert extended.split(":")[-1] == "/opt/extra/udf.jar"
    assert set(shipped["spark.jars"].split(",")) < set(extended.split(":"))


def test_delta_snapshots_are_rebuilt_with_the_maps_parallelism():
    conf = spark_conf(SparkConfig(shuffle_partitions=3))
    assert conf["spark.sql.shuffle.partitions"] == "3"
    assert conf["spark.databricks.delta.snapshotPartitions"] == "3"
    custom = {"spark.databricks.delta.snapshotPartitions": "8"}
    assert spark_conf(SparkConfig(conf=custom))["spark.databricks.delta.snapshotPartitions"] == "8"


def test_hadoop_aws_matches_the_hadoop_pyspark_ships():
    shipped = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    assert len(shipped) == 1
    hadoop = shipped[0].name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    assert _property("hadoop.version") == hadoop
    s3 = {p.name for p in jars("s3")}
    assert f"hadoop-aws-{hadoop}.jar" in s3
    # hadoop-aws's own Hadoop dependencies are pyspark's: none may come twice.
    bundled = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    assert not [n for n in s3 if _artifact(n) in bundled]


def _provided(module: str) -> dict[str, str]:
    """The provided dependencies of a jvm/ module: artifact to version."""
    tree = ET.parse(ROOT / "jvm" / module / "pom.xml")
    out = {}
    for dep in tree.iterfind("m:dependencies/m:dependency", NS):
        if dep.findtext("m:scope", namespaces=NS) == "provided":
            artifact = dep.findtext("m:artifactId", namespaces=NS) or ""
            out[artifact] = dep.findtext("m:version", namespaces=NS) or ""
    return out


def test_the_live_writer_compiles_against_the_jars_it_runs_with():
    """jvm/live is compiled against Spark, Scala, the Kafka client and gson, and finds them at
    run time in pyspark's jars and lib/spark: the versions must be those, and none of them
    may be copied into lib/live a second time."""
    live = [p.name for p in jars("live")]
    assert "materializer-live.jar" in live
    bundled = {p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    beside = {p.name for p in jars("spark")}
    provided = _provided("live")
    assert provided["spark-sql-api_${scala.binary}"] == "${spark.version}"
    for artifact in ("scala-library", "gson"):
        assert f"{artifact}-{provided[artifact]}.jar" in bundled, artifact
    assert f"kafka-clients-{provided['kafka-clients']}.jar" in beside
    present = {_artifact(n) for n in bundled | beside}
    assert not [n for n in live if _artifact(n) in present]

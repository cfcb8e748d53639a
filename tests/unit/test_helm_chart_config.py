"""The Helm chart as a whole, and the materializer config it renders.

helm lint, the Kubernetes schemas (kubernetes-validate) every manifest must match,
the parts a default install renders, the values schema refusing what it must; then
the ConfigMap's maps.yaml (checked as `materializer validate` checks it) and what
values pass into it (maps, Redis, object store, log format), the ServiceMonitor,
and the notes.

Rendered in process by Helm's own Go engine (helm-python-sdk, no helm binary; see
``tests.helpers.helm_chart``): no cluster and no network. The default and the
production renders are made once for this module.
"""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from materializer.config import validate_text
from tests.helpers.helm_chart import (
    CHART,
    CONFIG_PATH,
    KUBE_VERSION,
    NAMESPACE,
    PRODUCTION,
    Render,
    Rendered,
    container,
    production_values,
)

pytestmark = pytest.mark.usefixtures("no_env_overrides")


# --- lint and Kubernetes schemas ---------------------------------------------------------


@pytest.mark.parametrize("values_file", [None, PRODUCTION], ids=["default", "production"])
def test_chart_lints_clean(values_file: Path | None):
    values = yaml.safe_load(values_file.read_text()) if values_file else None
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    assert report["errors"] == []
    # Severity 2 is a warning, 3 an error; 1 (info) only suggests an icon.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    ("which", "without_schema"),
    [("default", set()), ("production", {"monitoring.coreos.com/v1 ServiceMonitor"})],
)
def test_manifests_match_the_kubernetes_schemas(
    which: str, without_schema: set[str], default: Rendered, production: Rendered
):
    rendered = default if which == "default" else production
    skipped = set()
    for doc in rendered.docs:
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            skipped.add(f"{doc['apiVersion']} {doc['kind']}")
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {exc.message} at {exc.path}")
    assert skipped == without_schema


def test_the_default_install_renders_each_part(default: Rendered):
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in default.docs)
    assert kinds == [
        "ConfigMap/mat-materializer",
        "Deployment/mat-materializer-driver",
        "Deployment/mat-materializer-query",
        "PersistentVolumeClaim/mat-materializer-data",
        "PodDisruptionBudget/mat-materializer-driver",
        "PodDisruptionBudget/mat-materializer-query",
        "Service/mat-materializer-driver",
        "Service/mat-materializer-query",
        "ServiceAccount/mat-materializer-driver",
    ]


def test_values_outside_the_schema_are_refused(render: Render):
    with pytest.raises(helm.HelmValuesError, match="driver/mode"):
        render({"driver": {"mode": "yarn"}})
    with pytest.raises(helm.HelmValuesError, match="spark/master"):
        render({"spark": {"master": "local[2]"}})  # the chart sets it from driver.mode
    with pytest.raises(helm.HelmValuesError, match="objectStore/deltaRoot"):
        render({"storage": {"type": "objectStore"}})


# --- the rendered config and the notes ---------------------------------------------------


def test_rendered_config_passes_materializer_validate(either: Rendered):
    """The same check as `materializer validate -c maps.yaml`."""
    assert validate_text(either.config_text(), "maps.yaml") == []


def test_a_bad_map_in_values_fails_materializer_validate(render: Render):
    rendered = render({"maps": {"users": {"fold": {"mode": "newest"}}}})
    assert validate_text(rendered.config_text()) == [
        "maps.users.fold.mode: must be one of latest, merge, aggregate"
    ]


def test_config_blocks_pass_through_from_values(production: Rendered):
    values = production_values()
    config = production.config()
    assert config["maps"] == values["maps"]
    assert config["enrichments"] == values["enrichments"]
    assert config["kafka"] == values["kafka"]
    assert config["query"]["near_cache"] == values["query"]["near_cache"]


def test_a_redis_cluster_is_declared_in_values(render: Render):
    rendered = render({"redis": {"url": "redis://redis-cluster:6379", "cluster": True}})
    assert rendered.config()["redis"] == {"url": "redis://redis-cluster:6379", "cluster": True}
    assert validate_text(rendered.config_text()) == []


def test_redis_url_from_an_existing_secret(production: Rendered):
    for suffix in ("-query", "-driver"):
        env = {e["name"]: e for e in container(production.one("Deployment", suffix))["env"]}
        assert env["MATERIALIZER_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
            "name": "materializer-redis",
            "key": "url",
        }


def test_service_monitor_is_off_by_default_and_scrapes_both_parts(
    default: Rendered, production: Rendered
):
    assert default.maybe("ServiceMonitor") is None
    monitor = production.one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    selector = monitor["spec"]["selector"]["matchLabels"]
    for suffix in ("-query", "-driver"):
        service = production.one("Service", suffix)
        assert selector.items() <= service["metadata"]["labels"].items()
        assert "metrics" in {p["name"] for p in service["spec"]["ports"]}


def test_notes_tell_how_to_reach_and_inspect(default: Rendered):
    assert "port-forward svc/mat-materializer-query 50051:50051" in default.notes
    assert "grpcurl -plaintext localhost:50051 grpc.health.v1.Health/Check" in default.notes
    assert f"materializer status -c {CONFIG_PATH}" in default.notes


@pytest.mark.parametrize("suffix", ["-query", "-driver"])
def test_both_parts_log_json_unless_values_say_text(render: Render, suffix: str):
    def log_format(rendered: Rendered) -> str:
        env = container(rendered.one("Deployment", suffix))["env"]
        value: str = next(e["value"] for e in env if e["name"] == "MATERIALIZER_LOG_FORMAT")
        return value

    assert log_format(render()) == "json"
    assert log_format(render({"logFormat": "text"})) == "text"
    with pytest.raises(helm.HelmValuesError, match="logFormat"):
        render({"logFormat": "xml"})


def test_an_object_store_reaches_the_config_without_keys(render: Render, production: Rendered):
    store = production.config()["object_store"]
    assert store == {"region": "eu-west-1", "path_style": False}
    values = production_values()
    values["storage"]["objectStore"] |= {"endpoint": "http://minio:9000", "pathStyle": True}
    custom = render(values).config()["object_store"]
    assert custom == {"region": "eu-west-1", "path_style": True, "endpoint": "http://minio:9000"}
    assert validate_text(render(values).config_text(), "maps.yaml") == []

"""The Helm chart in helm/materializer, rendered by Helm's own Go engine (helm-python-sdk,
no helm binary) and checked against the Kubernetes schemas (kubernetes-validate).

No cluster and no network: every test renders templates in process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from materializer.config import ENV_OVERRIDES, validate_text

CHART = Path(__file__).resolve().parents[2] / "helm" / "materializer"
PRODUCTION = CHART / "values-production.yaml"
KUBE_VERSION = "1.30.0"
RELEASE = "mat"
NAMESPACE = "data"
CONFIG_PATH = "/etc/materializer/maps.yaml"

Doc = dict[str, Any]


class Rendered:
    """The manifests of one render, looked up by kind and name suffix."""

    def __init__(self, files: dict[str, str]) -> None:
        self.notes = next((text for path, text in files.items() if path.endswith("NOTES.txt")), "")
        self.docs: list[Doc] = [
            doc
            for path, text in files.items()
            if not path.endswith(".txt")
            for doc in yaml.safe_load_all(text)
            if doc
        ]

    def all(self, kind: str) -> list[Doc]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, suffix: str = "") -> Doc:
        found = [d for d in self.all(kind) if d["metadata"]["name"].endswith(suffix)]
        assert len(found) == 1, f"{kind} *{suffix}: {[d['metadata']['name'] for d in found]}"
        return found[0]

    def maybe(self, kind: str, suffix: str = "") -> Doc | None:
        found = [d for d in self.all(kind) if d["metadata"]["name"].endswith(suffix)]
        return found[0] if found else None

    def config_text(self) -> str:
        text: str = self.one("ConfigMap")["data"]["maps.yaml"]
        return text

    def config(self) -> Doc:
        loaded: Doc = yaml.safe_load(self.config_text())
        return loaded


Render = Callable[..., Rendered]


def container(deployment: Doc) -> Doc:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    found: Doc = containers[0]
    return found


def production_values() -> Doc:
    loaded: Doc = yaml.safe_load(PRODUCTION.read_text())
    return loaded


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def render(chart: helm.Chart) -> Render:
    def _render(values: Doc | None = None) -> Rendered:
        return Rendered(chart.render(values, name=RELEASE, namespace=NAMESPACE))

    return _render


@pytest.fixture(scope="module")
def default(render: Render) -> Rendered:
    return render()


@pytest.fixture(scope="module")
def production(render: Render) -> Rendered:
    return render(production_values())


@pytest.fixture(params=["default", "production"])
def either(request: pytest.FixtureRequest, default: Rendered, production: Rendered) -> Rendered:
    return default if request.param == "default" else production


@pytest.fixture(autouse=True)
def _no_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """MATERIALIZER_* variables would change what the config validation sees."""
    for var in ENV_OVERRIDES:
        monkeypatch.delenv(var, raising=False)


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


# --- the query service -------------------------------------------------------------------


def test_query_probes_are_grpc_on_the_service_port(default: Rendered):
    query = container(default.one("Deployment", "-query"))
    service_port = next(
        p for p in default.one("Service", "-query")["spec"]["ports"] if p["name"] == "grpc"
    )
    assert service_port["port"] == 50051
    assert service_port["targetPort"] == "grpc"
    assert {"name": "grpc", "containerPort": 50051, "protocol": "TCP"} in query["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert query[probe]["grpc"] == {"port": 50051}, probe


def test_with_tls_the_probes_check_the_port_instead(production: Rendered):
    """The kubelet's gRPC probe speaks plaintext only."""
    query = container(production.one("Deployment", "-query"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert query[probe]["tcpSocket"] == {"port": "grpc"}
        assert "grpc" not in query[probe]


def test_the_query_port_follows_values(render: Render):
    rendered = render({"queryService": {"port": 6000, "metricsPort": 6001, "httpPort": 6002}})
    query = container(rendered.one("Deployment", "-query"))
    assert query["readinessProbe"]["grpc"] == {"port": 6000}
    assert {p["name"]: p["port"] for p in rendered.one("Service", "-query")["spec"]["ports"]} == {
        "grpc": 6000,
        "metrics": 6001,
        "http": 6002,
    }
    assert {"name": "http", "containerPort": 6002, "protocol": "TCP"} in query["ports"]
    assert rendered.config()["query"]["port"] == 6000
    assert rendered.config()["query"]["metrics_port"] == 6001
    assert rendered.config()["query"]["http_port"] == 6002
    # Off: neither port nor service port, and the process is told so.
    off = render({"queryService": {"httpPort": 0}})
    assert "http" not in {p["name"] for p in off.one("Service", "-query")["spec"]["ports"]}
    assert off.config()["query"]["http_port"] == 0


def test_replicas_hpa_and_pdb_follow_values(default: Rendered, production: Rendered):
    assert default.one("Deployment", "-query")["spec"]["replicas"] == 2
    assert default.maybe("HorizontalPodAutoscaler") is None
    assert default.one("PodDisruptionBudget")["spec"]["minAvailable"] == 1

    # With the autoscaler on, it owns the replica count.
    assert "replicas" not in production.one("Deployment", "-query")["spec"]
    hpa = production.one("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "mat-materializer-query",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    assert hpa["spec"]["metrics"][0]["resource"] == {
        "name": "cpu",
        "target": {"type": "Utilization", "averageUtilization": 65},
    }
    pdb = production.one("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 2
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "query"


def test_replicas_without_autoscaling_or_budget(render: Render):
    rendered = render(
        {
            "queryService": {
                "replicas": 5,
                "autoscaling": {"enabled": False},
                "podDisruptionBudget": {"enabled": False},
            }
        }
    )
    assert rendered.one("Deployment", "-query")["spec"]["replicas"] == 5
    assert rendered.maybe("HorizontalPodAutoscaler") is None
    assert rendered.maybe("PodDisruptionBudget") is None


def test_query_service_is_cluster_ip_with_grpc_and_metrics(either: Rendered):
    service = either.one("Service", "-query")
    assert service["spec"]["type"] == "ClusterIP"
    assert {p["name"] for p in service["spec"]["ports"]} == {"grpc", "metrics", "http"}


def test_auth_and_tls_come_from_existing_secrets(production: Rendered):
    assert production.all("Secret") == []
    config = production.config()["query"]
    assert config["auth"] == {"tokens_file": "/etc/materializer/auth/tokens.yaml"}
    assert config["tls"] == {
        "cert_file": "/etc/materializer/tls/tls.crt",
        "key_file": "/etc/materializer/tls/tls.key",
    }
    volumes = {
        v["name"]: v
        for v in production.one("Deployment", "-query")["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes["auth"]["secret"]["secretName"] == "materializer-tokens"
    assert volumes["tls"]["secret"]["secretName"] == "materializer-query-tls"
    mounts = {
        m["name"]: m["mountPath"]
        for m in container(production.one("Deployment", "-query"))["volumeMounts"]
    }
    assert mounts["auth"] == "/etc/materializer/auth"
    assert mounts["tls"] == "/etc/materializer/tls"


def test_auth_and_tls_secrets_made_from_values(render: Render):
    tokens = [{"token": "s3cret", "maps": ["users"], "verbs": ["get"]}]
    rendered = render(
        {
            "queryService": {
                "auth": {"enabled": True, "tokens": tokens},
                "tls": {
                    "enabled": True,
                    "mutual": True,
                    "cert": "CERT",
                    "key": "KEY",
                    "clientCa": "CA",
                },
            }
        }
    )
    auth = rendered.one("Secret", "-query-auth")
    assert yaml.safe_load(auth["stringData"]["tokens.yaml"]) == {"tokens": tokens}
    tls = rendered.one("Secret", "-query-tls")
    assert tls["type"] == "kubernetes.io/tls"
    assert set(tls["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert rendered.config()["query"]["tls"]["client_ca_file"] == "/etc/materializer/tls/ca.crt"
    for doc in rendered.all("Secret"):
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


# --- both workloads ----------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["-query", "-driver"])
def test_pods_run_as_non_root_with_a_read_only_root(either: Rendered, suffix: str):
    pod = either.one("Deployment", suffix)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(either.one("Deployment", suffix))["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    mounts = {
        m["mountPath"]: m["name"]
        for m in container(either.one("Deployment", suffix))["volumeMounts"]
    }
    tmp = next(v for v in pod["volumes"] if v["name"] == mounts["/tmp"])
    assert "emptyDir" in tmp


@pytest.mark.parametrize(
    ("suffix", "command"),
    [
        ("-query", ["query-service", "serve", "-c", CONFIG_PATH]),
        ("-driver", ["materializer", "run", "-c", CONFIG_PATH]),
    ],
)
def test_config_is_mounted_from_the_config_map(either: Rendered, suffix: str, command: list[str]):
    deployment = either.one("Deployment", suffix)
    main = container(deployment)
    assert main["command"][:4] == command
    mount = next(m for m in main["volumeMounts"] if m["mountPath"] == "/etc/materializer")
    assert mount["readOnly"] is True
    volume = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    )
    assert volume["configMap"]["name"] == either.one("ConfigMap")["metadata"]["name"]
    # A changed config rolls the pods.
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert len(annotations["checksum/config"]) == 64


def test_image_tag_defaults_to_app_version_and_follows_values(
    chart: helm.Chart, default: Rendered, render: Render
):
    app_version = chart.metadata["appVersion"]
    for suffix in ("-query", "-driver"):
        assert (
            container(default.one("Deployment", suffix))["image"] == f"materializer:{app_version}"
        )
    rendered = render({"image": {"repository": "registry.example/mat", "tag": "1.2.3"}})
    for suffix in ("-query", "-driver"):
        assert (
            container(rendered.one("Deployment", suffix))["image"] == "registry.example/mat:1.2.3"
        )


def test_resource_requests_are_set(either: Rendered):
    for suffix in ("-query", "-driver"):
        requests = container(either.one("Deployment", suffix))["resources"]["requests"]
        assert requests["cpu"]
        assert requests["memory"]
    prod = production_values()["queryService"]["resources"]
    assert container(either.one("Deployment", "-query"))["resources"] in (
        prod,
        yaml.safe_load((CHART / "values.yaml").read_text())["queryService"]["resources"],
    )


# --- the driver --------------------------------------------------------------------------


def test_the_driver_is_one_pod_replaced_not_rolled(either: Rendered):
    spec = either.one("Deployment", "-driver")["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    ports = {
        p["name"]: p["containerPort"]
        for p in container(either.one("Deployment", "-driver"))["ports"]
    }
    assert ports["metrics"] == 9465


def test_local_mode_with_a_volume(default: Rendered):
    config = default.config()
    assert config["spark"]["master"] == "local[*]"
    assert config["delta"]["root"] == "/data/warehouse"
    assert config["spark"]["checkpoint_root"] == "/data/checkpoints"
    assert config["metrics"]["port"] == 9465
    # The root filesystem is read-only: Spark's warehouse folder must not default to the cwd.
    assert config["spark"]["conf"]["spark.sql.warehouse.dir"] == "/tmp/spark-warehouse"
    assert default.maybe("Role") is None
    claim = default.one("PersistentVolumeClaim")
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    driver = default.one("Deployment", "-driver")
    mounts = {m["name"]: m["mountPath"] for m in container(driver)["volumeMounts"]}
    assert mounts["data"] == "/data"
    volume = next(v for v in driver["spec"]["template"]["spec"]["volumes"] if v["name"] == "data")
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert driver["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_query_pods_follow_a_single_node_volume(default: Rendered, render: Render):
    affinity = default.one("Deployment", "-query")["spec"]["template"]["spec"]["affinity"]
    (term,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "driver"
    shared = render({"storage": {"pvc": {"accessModes": ["ReadWriteMany"]}}})
    assert "affinity" not in shared.one("Deployment", "-query")["spec"]["template"]["spec"]


def test_volume_size_and_class_follow_values(render: Render):
    rendered = render({"storage": {"pvc": {"size": "100Gi", "storageClass": "fast"}}})
    claim = rendered.one("PersistentVolumeClaim")
    assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert claim["spec"]["storageClassName"] == "fast"


def test_kubernetes_mode_with_an_object_store(production: Rendered):
    config = production.config()
    spark = config["spark"]
    assert spark["master"] == "k8s://https://kubernetes.default.svc"
    assert config["delta"]["root"] == "s3a://materializer-prod/warehouse"
    assert spark["checkpoint_root"] == "s3a://materializer-prod/checkpoints"
    assert production.maybe("PersistentVolumeClaim") is None
    # Executors run the image: the jars (the S3 ones too) are on their class path already.
    assert spark["jars"] == "installed"
    assert validate_text(production.config_text(), "maps.yaml") == []
    conf = spark["conf"]
    assert conf["spark.executor.instances"] == "4"
    assert conf["spark.executor.cores"] == "2"
    assert conf["spark.executor.memory"] == "6g"
    assert conf["spark.kubernetes.container.image"] == "registry.example/materializer:0.1.0"
    assert conf["spark.kubernetes.namespace"] == NAMESPACE
    # Executors reach the driver through its headless Service.
    service = production.one("Service", "-driver")
    assert service["spec"]["clusterIP"] == "None"
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert conf["spark.driver.host"] == f"{service['metadata']['name']}.{NAMESPACE}.svc"
    assert conf["spark.driver.port"] == str(ports["driver"])
    assert conf["spark.driver.blockManager.port"] == str(ports["blockmanager"])
    # The user's own Spark settings pass through.
    assert (
        conf["spark.kubernetes.executor.secretKeyRef.AWS_ACCESS_KEY_ID"]
        == "materializer-s3:access-key"
    )


def test_kubernetes_mode_may_manage_executor_pods(production: Rendered):
    account = production.one("ServiceAccount")["metadata"]["name"]
    driver = production.one("Deployment", "-driver")["spec"]["template"]["spec"]
    assert driver["serviceAccountName"] == account
    assert driver["automountServiceAccountToken"] is True
    assert (
        production.config()["spark"]["conf"][
            "spark.kubernetes.authenticate.driver.serviceAccountName"
        ]
        == account
    )
    rules = production.one("Role")["rules"]
    verbs = {resource: set(rule["verbs"]) for rule in rules for resource in rule["resources"]}
    for resource in ("pods", "services", "configmaps"):
        assert {"create", "delete", "list", "watch"} <= verbs[resource], resource
    binding = production.one("RoleBinding")
    assert binding["roleRef"]["name"] == production.one("Role")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]


def test_executor_pod_template_is_a_valid_pod(production: Rendered):
    template = yaml.safe_load(production.one("ConfigMap")["data"]["executor-pod-template.yaml"])
    kubernetes_validate.validate(template, KUBE_VERSION, strict=True)
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    script = template["spec"]["containers"][0]["command"][-1]
    assert "KubernetesExecutorBackend" in script
    classpath = script.split("-cp ", 1)[1].split()[0].strip('"').split(":")
    assert {"$MATERIALIZER_JARS_DIR/spark/*", "$MATERIALIZER_JARS_DIR/s3/*"} <= set(classpath)
    assert production.config()["spark"]["conf"]["spark.kubernetes.executor.podTemplateFile"] == (
        "/etc/materializer/executor-pod-template.yaml"
    )


def test_kubernetes_mode_on_a_volume_mounts_it_in_executors(render: Render):
    rendered = render(
        {"driver": {"mode": "kubernetes"}, "storage": {"pvc": {"accessModes": ["ReadWriteMany"]}}}
    )
    conf = rendered.config()["spark"]["conf"]
    prefix = "spark.kubernetes.executor.volumes.persistentVolumeClaim.data"
    assert (
        conf[f"{prefix}.options.claimName"]
        == rendered.one("PersistentVolumeClaim")["metadata"]["name"]
    )
    assert conf[f"{prefix}.mount.path"] == "/data"


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

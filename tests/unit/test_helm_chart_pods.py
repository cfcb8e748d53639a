"""The Helm chart's pods: what both Deployments share, and the driver's own.

Both parts run as non-root on a read-only root, with the config mounted from the
ConfigMap and the image and resources from values; the driver runs in local mode on a
volume (a single one's query pods follow it to its node) or in Kubernetes mode with
an object store, managing executor pods from a pod template. The driver's worker
group is in ``test_helm_chart_workers``.

Rendered in process by Helm's own Go engine (helm-python-sdk, no helm binary; see
``tests.helpers.helm_chart``): no cluster and no network. The default and the
production renders are made once for this module.
"""

from __future__ import annotations

import subprocess

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
    Render,
    Rendered,
    container,
    production_values,
)

pytestmark = pytest.mark.usefixtures("no_env_overrides")


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
    # Arguments of the image's entrypoint (tini), which stays process 1.
    assert "command" not in main
    assert main["args"][:4] == command
    mount = next(m for m in main["volumeMounts"] if m["mountPath"] == "/etc/materializer")
    assert mount["readOnly"] is True
    volume = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    )
    assert volume["configMap"]["name"] == either.one("ConfigMap")["metadata"]["name"]
    # A changed config rolls the pods.
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert len(annotations["checksum/config"]) == 64


def test_image_defaults_to_the_one_make_image_builds_and_follows_values(
    chart: helm.Chart, default: Rendered, render: Render
):
    built = subprocess.run(
        ["make", "--silent", "--no-print-directory", "image-name"],
        cwd=CHART.parents[1],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert built == f"materializer:{chart.metadata['appVersion']}"
    for suffix in ("-query", "-driver"):
        assert container(default.one("Deployment", suffix))["image"] == built
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


def test_a_single_driver_is_replaced_not_rolled(render: Render):
    spec = render({"driver": {"replicas": 1}}).one("Deployment", "-driver")["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}


def test_the_driver_exposes_its_metrics(either: Rendered):
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
    single = render({"driver": {"replicas": 1}})
    affinity = single.one("Deployment", "-query")["spec"]["template"]["spec"]["affinity"]
    (term,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "driver"
    # The default group's volume is ReadWriteMany: the query pods go where they fit.
    assert "affinity" not in default.one("Deployment", "-query")["spec"]["template"]["spec"]
    shared = render(
        {"driver": {"replicas": 1}, "storage": {"pvc": {"accessModes": ["ReadWriteMany"]}}}
    )
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
    # Each driver of the group is reached by its executors at its own pod's address.
    service = production.one("Service", "-driver")
    assert service["spec"]["clusterIP"] == "None"
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert "spark.driver.host" not in conf
    env = {e["name"]: e for e in container(production.one("Deployment", "-driver"))["env"]}
    assert env["SPARK_LOCAL_HOSTNAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
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

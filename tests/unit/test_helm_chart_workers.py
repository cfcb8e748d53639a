"""The Helm chart's driver as a worker group.

The driver runs ``driver.replicas`` pods (two by default) of one group, named by
``driver.group`` or the release, each a worker named after its pod; an upgrade rolls
them one at a time and a PodDisruptionBudget keeps drains to one at a time. Several
drivers share the checkpoints, so they are on the object store or a ReadWriteMany
volume: the chart refuses a ReadWriteOnce one. One driver is replaced, not rolled, on
any volume. The pods' grace period covers ``spark.stop_timeout``, the drain.

Rendered in process by Helm's own Go engine (helm-python-sdk, no helm binary; see
``tests.helpers.helm_chart``): no cluster and no network. The default and the
production renders are made once for this module.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from materializer.config import validate_text
from tests.helpers.helm_chart import KUBE_VERSION, Render, Rendered, container

pytestmark = pytest.mark.usefixtures("no_env_overrides")

SHARED_CHECKPOINTS = "the drivers of a worker group share the checkpoints"


def driver_env(rendered: Rendered) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container(rendered.one("Deployment", "-driver"))["env"]}


def pod_labels(rendered: Rendered) -> dict[str, str]:
    labels: dict[str, str] = rendered.one("Deployment", "-driver")["spec"]["template"]["metadata"][
        "labels"
    ]
    return labels


# --- the group ---------------------------------------------------------------------------


def test_two_drivers_of_one_group_by_default(default: Rendered):
    spec = default.one("Deployment", "-driver")["spec"]
    assert spec["replicas"] == 2
    env = driver_env(default)
    # The release's full name, also the name of every object of the release.
    assert env["MATERIALIZER_WORKER_GROUP"]["value"] == "mat-materializer"
    assert env["MATERIALIZER_WORKER_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    # The group and the worker come from the environment, not from maps.yaml.
    config = default.config()
    assert "group" not in config["worker"]
    assert "id" not in config["worker"]
    assert validate_text(default.config_text(), "maps.yaml") == []


def test_the_group_is_named_by_values(render: Render):
    rendered = render({"driver": {"group": "orders.materializer"}})
    assert driver_env(rendered)["MATERIALIZER_WORKER_GROUP"]["value"] == "orders.materializer"


def test_the_worker_block_passes_through(render: Render):
    rendered = render({"worker": {"session_timeout": "10 seconds", "replication_factor": 3}})
    assert rendered.config()["worker"] == {"session_timeout": "10 seconds", "replication_factor": 3}
    assert validate_text(rendered.config_text(), "maps.yaml") == []


def test_an_upgrade_rolls_one_driver_at_a_time(default: Rendered, render: Render):
    spec = default.one("Deployment", "-driver")["spec"]
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    # The new driver has joined and taken its maps before the next one stops.
    assert spec["minReadySeconds"] == 30
    slower = render({"driver": {"replicas": 4, "minReadySeconds": 90}})
    assert slower.one("Deployment", "-driver")["spec"]["minReadySeconds"] == 90


def test_drains_stop_one_driver_at_a_time(default: Rendered, render: Render):
    budget = default.one("PodDisruptionBudget", "-driver")
    assert budget["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in budget["spec"]
    # It selects the driver pods, and only them.
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels(default).items()
    assert selector["app.kubernetes.io/component"] == "driver"
    half = render({"driver": {"replicas": 4, "podDisruptionBudget": {"maxUnavailable": "50%"}}})
    assert half.one("PodDisruptionBudget", "-driver")["spec"]["maxUnavailable"] == "50%"
    off = render({"driver": {"podDisruptionBudget": {"enabled": False}}})
    assert off.maybe("PodDisruptionBudget", "-driver") is None


@pytest.mark.parametrize(
    ("stop_timeout", "grace"),
    [("100 seconds", 120), ("5 minutes", 320), (90, 110), ("1.5 h", 5420), ("500 ms", 21)],
)
def test_the_grace_period_covers_the_drain(render: Render, stop_timeout: Any, grace: int):
    rendered = render({"spark": {"stop_timeout": stop_timeout}})
    pod = rendered.one("Deployment", "-driver")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == grace
    assert rendered.config()["spark"]["stop_timeout"] == stop_timeout
    assert validate_text(rendered.config_text(), "maps.yaml") == []


def test_the_default_grace_period_is_the_default_drain_and_twenty_seconds(default: Rendered):
    pod = default.one("Deployment", "-driver")["spec"]["template"]["spec"]
    assert default.config()["spark"]["stop_timeout"] == "100 seconds"
    assert pod["terminationGracePeriodSeconds"] == 120


# --- checkpoints every driver reaches ----------------------------------------------------


def test_a_group_on_a_volume_asks_for_read_write_many(default: Rendered):
    claim = default.one("PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert default.config()["spark"]["checkpoint_root"] == "/data/checkpoints"


@pytest.mark.parametrize(
    "storage",
    [
        {"pvc": {"accessModes": ["ReadWriteOnce"]}},
        {"pvc": {"accessModes": ["ReadWriteOncePod"]}},
        {"pvc": {"existingClaim": "data", "accessModes": ["ReadWriteOnce"]}},
    ],
    ids=["ReadWriteOnce", "ReadWriteOncePod", "existing-ReadWriteOnce"],
)
def test_a_group_on_a_single_node_volume_is_refused(render: Render, storage: dict[str, Any]):
    with pytest.raises(helm.HelmRenderError, match=SHARED_CHECKPOINTS) as refused:
        render({"storage": storage})
    message = str(refused.value)
    assert "driver.replicas 2" in message
    assert "object store" in message
    assert "ReadWriteMany" in message


def test_a_group_on_the_object_store_or_a_shared_volume_renders(render: Render):
    shared = render({"driver": {"replicas": 3}, "storage": {"pvc": {"existingClaim": "nfs-data"}}})
    assert shared.one("Deployment", "-driver")["spec"]["replicas"] == 3
    assert shared.maybe("PersistentVolumeClaim") is None
    explicit = render({"storage": {"pvc": {"accessModes": ["ReadWriteMany"]}}})
    assert explicit.one("PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]
    store = render(
        {
            "driver": {"replicas": 3},
            "storage": {
                "type": "objectStore",
                "pvc": {"accessModes": ["ReadWriteOnce"]},  # unused without a volume
                "objectStore": {"deltaRoot": "s3a://b/warehouse", "checkpointRoot": "s3a://b/cp"},
            },
        }
    )
    assert store.config()["spark"]["checkpoint_root"] == "s3a://b/cp"
    assert store.maybe("PersistentVolumeClaim") is None


# --- one driver --------------------------------------------------------------------------


def test_one_driver_on_a_read_write_once_volume_as_before(render: Render):
    rendered = render({"driver": {"replicas": 1}})
    spec = rendered.one("Deployment", "-driver")["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    assert "minReadySeconds" not in spec
    assert rendered.maybe("PodDisruptionBudget", "-driver") is None
    assert rendered.one("PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteOnce"]
    # A group of one: more drivers join it when the checkpoints allow.
    assert driver_env(rendered)["MATERIALIZER_WORKER_GROUP"]["value"] == "mat-materializer"
    assert validate_text(rendered.config_text(), "maps.yaml") == []
    pinned = render(
        {"driver": {"replicas": 1}, "storage": {"pvc": {"accessModes": ["ReadWriteOnce"]}}}
    )
    assert pinned.one("PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteOnce"]


@pytest.mark.parametrize("replicas", [1, 3])
def test_manifests_match_the_kubernetes_schemas(render: Render, replicas: int):
    rendered = render({"driver": {"replicas": replicas}})
    for doc in rendered.docs:
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {exc.message} at {exc.path}")


# --- executors of several drivers --------------------------------------------------------


def test_each_driver_of_a_group_gives_its_executors_its_own_address(render: Render):
    group = render(
        {"driver": {"mode": "kubernetes"}, "storage": {"pvc": {"accessModes": ["ReadWriteMany"]}}}
    )
    conf = group.config()["spark"]["conf"]
    # Not the Service (it names every driver) nor one executor name prefix for all.
    assert "spark.driver.host" not in conf
    assert "spark.kubernetes.executor.podNamePrefix" not in conf
    assert driver_env(group)["SPARK_LOCAL_HOSTNAME"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "status.podIP"}
    }
    single = render({"driver": {"mode": "kubernetes", "replicas": 1}})
    conf = single.config()["spark"]["conf"]
    assert conf["spark.driver.host"] == "mat-materializer-driver.data.svc"
    assert conf["spark.kubernetes.executor.podNamePrefix"] == "mat-materializer-driver"
    assert "SPARK_LOCAL_HOSTNAME" not in driver_env(single)


def test_production_runs_a_group_spread_over_nodes(production: Rendered):
    spec = production.one("Deployment", "-driver")["spec"]
    assert spec["replicas"] == 2
    assert production.one("PodDisruptionBudget", "-driver")["spec"]["maxUnavailable"] == 1
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert selector.items() <= pod_labels(production).items()
    assert production.config()["spark"]["checkpoint_root"].startswith("s3a://")


# --- the values schema -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"driver": {"replicas": 0}}, "driver/replicas"),
        ({"driver": {"replicas": -1}}, "driver/replicas"),
        ({"driver": {"replicas": "2"}}, "driver/replicas"),
        ({"driver": {"replicas": 1.5}}, "driver/replicas"),
        ({"driver": {"group": "my group"}}, "driver/group"),
        ({"driver": {"group": "-leading-dash"}}, "driver/group"),
        ({"driver": {"minReadySeconds": -5}}, "driver/minReadySeconds"),
        ({"driver": {"podDisruptionBudget": {"maxUnavailable": 0}}}, "maxUnavailable"),
        ({"driver": {"podDisruptionBudget": {"maxUnavailable": "half"}}}, "maxUnavailable"),
        ({"worker": {"group": "mine"}}, "worker/group"),
        ({"worker": {"id": "me"}}, "worker/id"),
        ({"spark": {"stop_timeout": "a while"}}, "spark/stop_timeout"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_group_values_are_refused(render: Render, values: dict[str, Any], where: str):
    with pytest.raises(helm.HelmValuesError, match=where):
        render(values)

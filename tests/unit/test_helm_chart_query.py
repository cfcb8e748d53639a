"""The Helm chart's query service: its Deployment and Service.

gRPC probes on the service port (a TCP check with TLS on), ports that follow
values, replicas with the autoscaler and the disruption budget, and auth and TLS
from existing Secrets or Secrets made from values.

Rendered in process by Helm's own Go engine (helm-python-sdk, no helm binary; see
``tests.helpers.helm_chart``): no cluster and no network. The default and the
production renders are made once for this module.
"""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from tests.helpers.helm_chart import (
    KUBE_VERSION,
    Render,
    Rendered,
    container,
)

pytestmark = pytest.mark.usefixtures("no_env_overrides")


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
    rendered = render(
        {
            "queryService": {
                "port": 6000,
                "metricsPort": 6001,
                "httpPort": 6002,
                "flightSqlPort": 6003,
            }
        }
    )
    query = container(rendered.one("Deployment", "-query"))
    assert query["readinessProbe"]["grpc"] == {"port": 6000}
    assert {p["name"]: p["port"] for p in rendered.one("Service", "-query")["spec"]["ports"]} == {
        "grpc": 6000,
        "metrics": 6001,
        "http": 6002,
        "flight-sql": 6003,
    }
    assert {"name": "http", "containerPort": 6002, "protocol": "TCP"} in query["ports"]
    assert {"name": "flight-sql", "containerPort": 6003, "protocol": "TCP"} in query["ports"]
    assert rendered.config()["query"]["sql"]["flight_port"] == 6003
    assert rendered.config()["query"]["port"] == 6000
    assert rendered.config()["query"]["metrics_port"] == 6001
    assert rendered.config()["query"]["http_port"] == 6002
    # Off: neither port nor service port, and the process is told so.
    off = render({"queryService": {"httpPort": 0, "flightSqlPort": 0}})
    names = {p["name"] for p in off.one("Service", "-query")["spec"]["ports"]}
    assert "http" not in names and "flight-sql" not in names
    assert off.config()["query"]["http_port"] == 0
    assert off.config()["query"]["sql"]["flight_port"] == 0
    # The chart's port joins the SQL settings a user gives, never replaces them.
    tuned = render({"query": {"sql": {"max_rows": 5000}}})
    assert tuned.config()["query"]["sql"] == {"max_rows": 5000, "flight_port": 32010}


def test_replicas_hpa_and_pdb_follow_values(default: Rendered, production: Rendered):
    assert default.one("Deployment", "-query")["spec"]["replicas"] == 2
    assert default.maybe("HorizontalPodAutoscaler") is None
    assert default.one("PodDisruptionBudget", "-query")["spec"]["minAvailable"] == 1

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
    pdb = production.one("PodDisruptionBudget", "-query")
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
    assert rendered.maybe("PodDisruptionBudget", "-query") is None


def test_query_service_is_cluster_ip_with_its_ports(either: Rendered):
    service = either.one("Service", "-query")
    assert service["spec"]["type"] == "ClusterIP"
    names = {p["name"] for p in service["spec"]["ports"]}
    assert names == {"grpc", "metrics", "http", "flight-sql"}


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

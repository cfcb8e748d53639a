"""The Helm chart in helm/materializer rendered in process by Helm's own Go engine
(helm-python-sdk, no helm binary): its paths and release, and the rendered manifests
looked up by kind and name. Shared by the chart's test modules, each of which renders
the chart once per module through its own fixtures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from materializer.config import ENV_OVERRIDES

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


def renderer(chart: helm.Chart) -> Render:
    """Renders of ``chart`` as release ``RELEASE`` in ``NAMESPACE``, with the values given."""

    def _render(values: Doc | None = None) -> Rendered:
        return Rendered(chart.render(values, name=RELEASE, namespace=NAMESPACE))

    return _render


def container(deployment: Doc) -> Doc:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    found: Doc = containers[0]
    return found


def production_values() -> Doc:
    loaded: Doc = yaml.safe_load(PRODUCTION.read_text())
    return loaded


def clear_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """MATERIALIZER_* variables would change what the config validation sees."""
    for var in ENV_OVERRIDES:
        monkeypatch.delenv(var, raising=False)

"""The committed generated code is exactly what `make proto` would write now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STALE = "stale generated code: run `make proto` and commit the result"


def generated_files(root: Path) -> dict[Path, bytes]:
    """Every file under the packages generated from proto/, keyed by repo-relative path."""
    packages = {p.relative_to(REPO / "proto").parent for p in (REPO / "proto").rglob("*.proto")}
    files = {}
    for package in packages:
        for f in (root / package).iterdir():
            if f.is_file():
                files[f.relative_to(root)] = f.read_bytes()
    return files


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "tools.codegen", "--out", str(tmp_path)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )

    fresh = generated_files(tmp_path)
    committed = generated_files(REPO)

    assert fresh, "codegen wrote nothing"
    assert sorted(fresh) == sorted(committed), STALE
    for path, content in fresh.items():
        assert committed[path] == content, f"{path}: {STALE}"


def test_generated_modules_import() -> None:
    from materializer.v1 import map_service_pb2, map_service_pb2_grpc

    assert map_service_pb2.DESCRIPTOR.package == "materializer.v1"
    assert hasattr(map_service_pb2_grpc, "MapServiceStub")

"""The Lua library and the Python that calls it agree on every name they share."""

from __future__ import annotations

import re

from materializer.contract.redis_layout import EXPIRE_OP, READ_FUNCTION
from materializer.redis import functions


def test_the_library_registers_exactly_the_functions_python_calls() -> None:
    registered = set(re.findall(r"'(materializer_[a-z_]+_v[0-9]+)'", functions.SOURCE))
    called = {functions.LATEST, functions.READ, functions.PUT, functions.FILL, functions.EXPIRE}
    called |= {functions.LIVE, functions.TRUNCATE, functions.INDEX_BUILD, functions.INDEX_READ}
    called |= {functions.NEXT_EPOCH, functions.RAISE_EPOCH, *functions.LEGACY}
    assert registered == called
    assert functions.READ == READ_FUNCTION


def test_the_library_is_named_and_answers_the_errors_python_recognises() -> None:
    assert functions.SOURCE.startswith(f"#!lua name={functions.LIBRARY}\n")
    assert f"'{functions.LOST} " in functions.SOURCE
    assert f"'{functions.FENCED} " in functions.SOURCE
    assert f"'op', '{EXPIRE_OP}'" in functions.SOURCE


def test_the_library_is_shipped_as_package_data() -> None:
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["materializer.redis"]
    assert set(functions.PARTS) <= set(shipped)

"""The base of every config model, and the names the pipeline reserves."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
)

INTERNAL_PREFIX = "__"
"""Column names the pipeline adds start with it; no entity field or key may."""


KAFKA_KEY = "$kafka_key"


FoldPath = Literal["microbatch", "realtime"]
"""How a caught-up map folds (``spark.path``, a map's ``path``)."""


MAP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class _Model(BaseModel):
    # Durations dump as seconds, which a config file takes back (a map's definition read
    # back from the API is a valid section to put again).
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_timedelta="float")

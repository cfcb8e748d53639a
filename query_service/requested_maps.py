"""The maps a request names, for per-map grants: what ``MethodCall`` checks a token's
grant against before a method runs (``query_service.auth``).

It reads requests of every service, SQL statements included, so it sits above both the
tokens (``auth``) and the SQL engine (``sql``), which imports the tokens' grants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from materializer.catalog.live import LiveMaps, as_live
from materializer.config import AppConfig
from query_service.sql.statement import check as check_statement


def request_maps(config: AppConfig | LiveMaps) -> Callable[[str, Any], list[str]]:
    """For per-map grants: the maps a request names.

    A status request without a map asks about every map; an Enrich request
    names the maps of its lookups, or of its profile.
    """
    live = as_live(config)
    profiles = {
        name: [lookup.map for lookup in profile.lookups]
        for name, profile in live.config.query.enrich_profiles.items()
    }

    def maps(method: str, request: Any) -> list[str]:
        if method.endswith(".SqlService/Execute"):
            return list(check_statement(request.sql).maps)
        if method.endswith("/Enrich"):
            if request.HasField("spec"):
                return [lookup.map for lookup in request.spec.lookups]
            return profiles.get(request.profile, [])
        name = getattr(request, "map", None)
        if name is None:
            return []
        if not name and method.endswith("/GetStatus"):
            return sorted(live.config.maps)
        return [name] if name else []

    return maps

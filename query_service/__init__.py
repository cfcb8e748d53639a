"""The gRPC query service: lookups in the maps the materializer keeps in Redis."""

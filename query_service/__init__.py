"""The gRPC query service: lookups in the maps the materializer keeps in Redis."""

import os

# The service starts its SQL statement processes with fork and exec while gRPC's threads
# run; gRPC's fork handlers (for children that go on using gRPC, which these never do)
# would be skipped with a warning at every start. Read when grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

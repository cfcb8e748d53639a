"""The HTTP/JSON front: the gRPC calls served as JSON over HTTP, with the OpenAPI document
built from the same endpoint table, in the same process and over the same stores."""

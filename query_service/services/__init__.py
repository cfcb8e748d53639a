"""gRPC servicers: request validation and message conversion, no storage logic."""

"""The wire contract: the gRPC messages (generated from oddl.proto) and the schedule codec both sides use."""

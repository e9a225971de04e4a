"""The wire contract: the gRPC messages (generated from oddl.proto) and the schedule codec both sides use."""

if __name__ != "oddl.protos":  # one name per module (docs/decisions/0025-one-import-root.md)
    raise ImportError(f"{__name__} is oddl's protos/ folder: import it as oddl.protos")

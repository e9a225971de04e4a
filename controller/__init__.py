"""The run-time controller: the gRPC service, jobs, device management, the store and the pure scheduling core."""

if __name__ != "oddl.controller":  # one name per module (docs/decisions/0025-one-import-root.md)
    raise ImportError(f"{__name__} is oddl's controller/ folder: import it as oddl.controller")

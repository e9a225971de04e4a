"""The run-time controller: the gRPC service, jobs, device management, the store and the pure scheduling core."""

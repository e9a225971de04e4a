"""The training process's side of the local agent: `AgentClient`, its connection and buckets,
the native collectives it lays out, adopted memory, and driving every rank from one process."""

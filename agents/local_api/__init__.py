"""The agent's side of the local API: where it listens and its wire form (`wire`), the
request server, and the buckets clients hand over as descriptors."""

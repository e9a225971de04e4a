"""Offline tools that run no testbed: the cluster simulator, TopoOpt's co-optimiser and the OptINC optical model."""

if __name__ != "oddl.offline":  # one name per module (docs/decisions/0025-one-import-root.md)
    raise ImportError(f"{__name__} is oddl's offline/ folder: import it as oddl.offline")

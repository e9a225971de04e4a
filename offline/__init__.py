"""Offline tools that run no testbed: the cluster simulator, TopoOpt's co-optimiser and the OptINC optical model."""

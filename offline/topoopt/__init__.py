"""TopoOpt (NSDI 2023) offline: the job model, the topology and strategy search, the authors' pieces and sweeps."""

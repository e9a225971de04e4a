"""Experiments as code (issue 37, decision record 0031): a declarative experiment file, the
runner that sweeps its points over emulated testbeds, the run folder that records what ran
and on what, an index of every run in SQLite, and the standard figures."""

"""`oddl demo`: the emulated testbed end to end with a numpy workload (`run`), and with real
PyTorch training (`train`, its supervisor, workers and report)."""

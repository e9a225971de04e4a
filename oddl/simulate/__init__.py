"""`oddl simulate`'s output: tables and plots of the cluster-scale simulator."""

"""The cluster simulator: one training iteration of data-parallel DL at up to 1024 nodes, on seven networks."""

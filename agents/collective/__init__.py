"""One collective at one node: the runner from the training process's call to its outcome,
the start (barrier or standing schedule), the plan's steps gated into slots (pipelined or step by
step), OptINC's device run, and the outcome round."""

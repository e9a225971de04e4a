"""The per-node agent: link to the controller, local API for the training process, and the
collective runner."""

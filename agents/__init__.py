"""The per-node agent: link to the controller, local API for the training process, and the
collective runner."""

if __name__ != "oddl.agents":  # one name per module (docs/decisions/0025-one-import-root.md)
    raise ImportError(f"{__name__} is oddl's agents/ folder: import it as oddl.agents")

"""oddl: a testbed controller for all-optical networks carrying distributed deep learning."""

__version__ = "0.1.0"

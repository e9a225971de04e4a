"""The ground floor: errors, configuration, metrics, security and shared memory, which every other
layer may import and which imports none of them."""

__version__ = "0.1.0"

"""oddl subpackage."""

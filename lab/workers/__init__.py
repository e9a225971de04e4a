"""Scripts the rig runs inside a host with the lab's venv (they import only the installed
oddl, numpy and torch, never the rig)."""

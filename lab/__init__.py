"""The lab rehearsal rig: five hosts of a lab on one Linux machine (docs/how-to/lab-bring-up.md).

Tooling, not part of the wheel: network namespaces joined by a bridge, links shaped with tbf,
a mount namespace per host, the package installed from a built wheel, the systemd units'
command lines under the service user, and the lab steps of docs/how-to/lab-bring-up.md and a lab's faults, each
checked exactly. `python -m lab` (or `make lab`) runs it.
"""

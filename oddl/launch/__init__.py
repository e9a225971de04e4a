"""Starting an emulated testbed's processes (`testbed`, `processes`) and the testbed files oddl
ships (`shipped`)."""

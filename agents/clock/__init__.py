"""The agent's clocks: the wall clock every timestamp goes through, the offset filter, the
sync loop against the controller and the excursion warnings."""

"""Backend choice, flight-recorder environment and two-phase timeouts: everything that must be
right before and just after the process group is created."""

"""The agent's data links between nodes, chosen from the testbed file (`choice`): ZeroMQ
frames, TCP chunk streams and their authentication, the emulated physical layer and the
measured line rate."""

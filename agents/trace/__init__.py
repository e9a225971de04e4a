"""The agent's timeline: its events per collective, slot and chunk, and the switch that
starts and stops recording."""

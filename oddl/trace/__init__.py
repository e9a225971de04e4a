"""Reading recorded timelines: files, `merge`, `summary` and `plot`."""

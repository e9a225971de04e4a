"""The `oddl` command line's exit codes."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_REFUSED = 0, 1, 2, 3, 4
"""0 success; 1 the operation ran and failed (e.g. a wrong all-reduce result); 2 usage or
configuration error; 3 the controller could not be reached; 4 the controller refused."""

EXIT_PIPE_CLOSED = 141
"""The reader of the output went away (`oddl plan … | head`): what a shell reports for a
command that SIGPIPE ended (128 + 13), without Python's traceback."""

"""The `oddl` command line: `main` builds the command tree, each module registers its commands."""

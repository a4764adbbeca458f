"""The `dsl` command line, on top of every other layer."""

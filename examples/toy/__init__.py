"""A small streaming tail with the failure modes of the real ones, for tests and docs/runtime.md."""

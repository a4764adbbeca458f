"""The bench harness: variants of a tail side by side in one process."""

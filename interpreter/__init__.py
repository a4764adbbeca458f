"""Plans derived from a checked ``.clock`` program, and the runtime that executes them."""

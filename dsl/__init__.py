"""The ``.clock`` language: parse, check, dependency graph, render, and the ``dsl`` CLI."""

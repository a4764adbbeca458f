"""The ``.clock`` language: parse, resolve, check, the dependency graph, diagnostics and the formatter
(no torch; the ``dsl`` command is ``duplexcadence.interpreter.cli``)."""

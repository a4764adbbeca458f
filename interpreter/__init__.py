"""What a checked ``.clock`` program becomes: plans (``plans``), drawings of them (``views``), the runtime
that executes them (``runtime``), the bench, drafting and the tail registry, and the ``dsl`` command
line (``cli``). docs/architecture.md shows the layers."""

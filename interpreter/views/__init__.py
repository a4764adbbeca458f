"""Views of a plan drawn with graphviz (no torch): timeline, dataflow graph, arena map."""

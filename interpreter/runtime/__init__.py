"""The runtime (torch): the arena, binding, graph capture and the step path of sessions."""

"""Plans: pure functions of a checked program (no torch). The passes, in order:
clocks -> trace -> allocation -> arena -> capture, composed by `plan.make_plan`."""

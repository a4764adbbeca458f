"""The runtime (torch): a plan bound to a model, sessions at stable addresses, exact-shape graph replay.

`runtime.py` (`Runtime`) and `session.py` (`Session`, the step path) are the entry points; `errors.py`,
`inputs.py`, `body.py`, `replay.py`, `capture/` (the capture strategies and the capture), `rng.py`,
`lanes.py` and `reports.py` each own one concept, on `binding.py` and `storage.py`.
"""

"""Sessions across GPUs and nodes with Ray Serve: one replica per GPU owns that GPU's pool."""

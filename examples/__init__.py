"""Released model tails under DuplexCadence: one subpackage per model."""

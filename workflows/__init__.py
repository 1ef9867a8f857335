"""The control plane: the training workflow (batches, train steps, weight updates, staleness) and
one workflow per trajectory. Deterministic code only; it imports the contracts, config and queue
names, never an activity's implementation."""

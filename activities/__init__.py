"""The data plane: the activities the workflows schedule (env, generate, reward, train) and the
router's local activities. Each takes its name and message types from rollart.contracts."""

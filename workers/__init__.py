"""The resource plane: the processes that serve the task queues (fleet workers), the embedded
stack and dev server, the Temporal client, and the `rollart` command line."""

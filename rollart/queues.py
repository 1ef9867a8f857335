"""Task queue names: one per (role, pool), plus per-replica or per-worker queues where one process
must be hit (a replica's weight update, the env worker that holds an env's state)."""

from __future__ import annotations


def pool_queue(role: str, pool: str) -> str:
    return f"rollart.{role}.{pool}"


def replica_queue(role: str, pool: str, replica: int) -> str:
    return f"rollart.{role}.{pool}.r{replica}"


def admin_queue(queue: str) -> str:
    """A worker's queue for pings and control work (weight updates), apart from its work queue: a
    worker with every work slot busy still answers there, so a full queue is not taken for a dead
    worker and an update never waits behind generate requests."""
    return f"{queue}.admin"

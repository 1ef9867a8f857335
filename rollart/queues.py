"""Task queue names: one per (role, pool), plus per-replica or per-worker queues where one process
must be hit (a replica's weight update, the env worker that holds an env's state)."""

from __future__ import annotations


def pool_queue(role: str, pool: str) -> str:
    return f"rollart.{role}.{pool}"


def replica_queue(role: str, pool: str, replica: int) -> str:
    return f"rollart.{role}.{pool}.r{replica}"

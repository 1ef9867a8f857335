"""Bytes by key, on local disk or S3: what the trajectory store, checkpoints and durable weight
copies are written to.

A location is a URL: a plain path (or file://) for a directory, `s3://bucket/prefix` for S3. S3
settings (endpoint, region, credentials) come from the run config's `storage` section or, when it
leaves them out, boto3's usual chain (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, profiles, ...).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Protocol

from rollart.config import StorageConfig


class ByteStore(Protocol):
    """Bytes by key: what blob stores and weight backends (rollart.weights) both are."""

    name: str

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes | None:
        """The bytes under `key`, or None if there are none (never written, or evicted)."""

    def delete(self, prefix: str) -> None:
        """Drop every key under `prefix`."""

    def close(self) -> None: ...


class BlobStore(ByteStore, Protocol):
    """A durable byte store that can also list what it holds (off the hot path only)."""

    url: str

    def keys(self, prefix: str) -> list[str]:
        """Every key under `prefix`, sorted."""


class LocalBlobs:
    name = "local"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad key {key!r}")
        return self.root / key

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        staging.write_bytes(data)
        staging.replace(path)  # atomic: a reader sees the old bytes or the new ones

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def keys(self, prefix: str) -> list[str]:
        """Walks only the directory the prefix names (a prefix ending in "/" is a directory:
        one that does not exist holds nothing)."""
        base = self._path(prefix.rstrip("/")) if prefix.rstrip("/") else self.root
        directory = base if prefix.endswith("/") or base.is_dir() else base.parent
        if not directory.is_dir():
            return []
        found = (str(p.relative_to(self.root)) for p in directory.rglob("*")
                 if p.is_file() and not p.name.startswith("."))
        return sorted(k for k in found if k.startswith(prefix))

    def delete(self, prefix: str) -> None:
        path = self._path(prefix.rstrip("/"))
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            for key in self.keys(prefix):
                self._path(key).unlink(missing_ok=True)

    def close(self) -> None:
        pass


class S3Blobs:
    name = "s3"

    def __init__(self, bucket: str, prefix: str, config: StorageConfig | None = None) -> None:
        import boto3
        from botocore.config import Config

        config = config or StorageConfig()
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}"
        secret = config.secret_access_key
        self.client = boto3.client(
            "s3", endpoint_url=config.endpoint_url, region_name=config.region,
            aws_access_key_id=config.access_key_id,
            aws_secret_access_key=secret.get_secret_value() if secret else None,
            config=Config(retries={"max_attempts": 5, "mode": "standard"},
                          max_pool_connections=64))

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def get(self, key: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None

    def keys(self, prefix: str) -> list[str]:
        strip = len(self.prefix) + 1 if self.prefix else 0
        found = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._key(prefix)):
            found += [item["Key"][strip:] for item in page.get("Contents", [])]
        return sorted(found)

    def delete(self, prefix: str) -> None:
        keys = self.keys(prefix)
        for start in range(0, len(keys), 1000):
            self.client.delete_objects(Bucket=self.bucket, Delete={
                "Objects": [{"Key": self._key(k)} for k in keys[start:start + 1000]]})

    def close(self) -> None:
        self.client.close()


def open_blobs(url: str, config: StorageConfig | None = None) -> BlobStore:
    """The store at `url`: `s3://bucket/prefix`, or a local directory."""
    if url.startswith("s3://"):
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise ValueError(f"storage: {url!r} names no bucket (s3://bucket/prefix)")
        return S3Blobs(bucket, prefix, config)
    return LocalBlobs(url.removeprefix("file://"))


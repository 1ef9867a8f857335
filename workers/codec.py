"""Optional encryption of every payload Temporal stores: workflow inputs and results, activity
arguments, signals. Trajectory data in histories is then unreadable without the key, and the
Web UI shows it through `rollart codec-server` (which holds the key) instead.

AES-GCM with a 128/192/256-bit key given base64-encoded in the environment variable that
`temporal.encryption_key_env` names; the key never enters the config or a history.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec

ENCODING = b"binary/encrypted"
NONCE_BYTES = 12


class EncryptionCodec(PayloadCodec):
    def __init__(self, key: bytes, key_id: str = "rollart") -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if len(key) not in (16, 24, 32):
            raise ValueError(f"payload encryption key must be 16, 24 or 32 bytes, got {len(key)}")
        self.aead, self.key_id = AESGCM(key), key_id

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self.aead.encrypt(nonce, payload.SerializeToString(), None)
        return Payload(metadata={"encoding": ENCODING, "encryption-key-id": self.key_id.encode()},
                       data=nonce + sealed)

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload  # written before encryption was switched on
        data = payload.data
        return Payload.FromString(self.aead.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], None))


def codec_from_env(variable: str | None) -> EncryptionCodec | None:
    """The codec for `temporal.encryption_key_env`, or None when encryption is off."""
    if not variable:
        return None
    raw = os.environ.get(variable)
    if not raw:
        raise ValueError(f"temporal.encryption_key_env: the environment variable {variable} "
                         "that should hold the payload key (base64) is not set")
    try:
        key = base64.b64decode(raw, validate=True)
    except binascii.Error as err:
        raise ValueError(f"{variable} is not base64: {err}") from None
    return EncryptionCodec(key)


def codec_server(codec: EncryptionCodec, port: int, ui_origin: str) -> ThreadingHTTPServer:
    """Temporal's remote codec protocol (POST /encode, POST /decode) on 127.0.0.1, for the Web
    UI at `ui_origin`."""

    class Handler(BaseHTTPRequestHandler):
        def _cors(self) -> None:
            self.send_header("Access-Control-Allow-Origin", ui_origin)
            self.send_header("Access-Control-Allow-Methods", "POST, OPTIONS")
            self.send_header("Access-Control-Allow-Headers", "content-type, x-namespace")
            self.send_header("Access-Control-Allow-Credentials", "true")

        def do_OPTIONS(self) -> None:  # noqa: N802
            self.send_response(200)
            self._cors()
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802
            if self.path not in ("/encode", "/decode"):
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            payloads = json_format.Parse(body, Payloads())
            convert = codec.encrypt if self.path == "/encode" else codec.decrypt
            out = Payloads(payloads=[convert(p) for p in payloads.payloads])
            data = json_format.MessageToJson(out).encode()
            self.send_response(200)
            self._cors()
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # payloads never reach the logs
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)

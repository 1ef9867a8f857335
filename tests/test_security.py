"""Security: payload encryption in histories (with a codec endpoint for the Web UI), TLS / mTLS
and API keys for remote Temporal clusters, and secrets that never reach histories or logs."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import urllib.request

import pytest
from conftest import make_config
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.client import Client
from temporalio.service import TLSConfig
from tls_proxy import make_pki, tls_proxy

from rollart.config import TemporalConfig
from rollart.contracts import TrajectoryResult, TrajectorySpec
from rollart.servers import free_port
from rollart.workers.client import client_options, connect
from rollart.workers.codec import ENCODING, EncryptionCodec, codec_from_env, codec_server
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.trajectory import TrajectoryWorkflow

KEY = base64.b64encode(bytes(range(32))).decode()


@pytest.mark.asyncio(loop_scope="session")
async def test_codec_round_trip_and_wrong_key():
    codec = EncryptionCodec(bytes(range(32)))
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'{"secret": "trajectory"}')
    [sealed] = await codec.encode([plain])
    assert sealed.metadata["encoding"] == ENCODING and b"trajectory" not in sealed.data
    assert (await codec.decode([sealed]))[0] == plain
    assert (await codec.decode([plain]))[0] == plain  # written before encryption: passed through
    with pytest.raises(Exception):  # noqa: B017 (cryptography's InvalidTag)
        await EncryptionCodec(bytes(32)).decode([sealed])


def test_codec_key_comes_from_the_environment_only(monkeypatch):
    assert codec_from_env(None) is None
    monkeypatch.delenv("ROLLART_TEST_KEY", raising=False)
    with pytest.raises(ValueError, match="ROLLART_TEST_KEY .* is not set"):
        codec_from_env("ROLLART_TEST_KEY")
    monkeypatch.setenv("ROLLART_TEST_KEY", "not base64!")
    with pytest.raises(ValueError, match="not base64"):
        codec_from_env("ROLLART_TEST_KEY")
    monkeypatch.setenv("ROLLART_TEST_KEY", base64.b64encode(b"short").decode())
    with pytest.raises(ValueError, match="16, 24 or 32 bytes"):
        codec_from_env("ROLLART_TEST_KEY")


@pytest.mark.asyncio(loop_scope="session")
async def test_encrypted_run_keeps_trajectories_out_of_the_history(temporal_server, engine,
                                                                   tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLART_PAYLOAD_KEY", KEY)
    config = make_config(temporal_server, tmp_path, **{
        "temporal.encryption_key_env": "ROLLART_PAYLOAD_KEY",
        "domains.frozenlake.max_turns": 3})
    spec = TrajectorySpec.for_domain(config, "frozenlake", "sealed-1", "g", seed=1)
    async with in_process_fleet(config, engine, ("control", "env", "reward", "gen")) as client:
        result = await client.execute_workflow(
            TrajectoryWorkflow.run, spec, id=spec.trajectory_id,
            task_queue=config.temporal.control_queue, result_type=TrajectoryResult)
    assert result.status == "completed"
    raw = await Client.connect(temporal_server.address)  # no codec: what the server stores
    history = await raw.get_workflow_handle("sealed-1").fetch_history()
    payloads = [p for e in history.events for p in _payloads(e)]
    assert payloads and all(p.metadata["encoding"] == ENCODING for p in payloads)
    assert not any(b"frozenlake" in p.data or b"sealed-1" in p.data for p in payloads)


def _payloads(event) -> list[Payload]:
    for field in ("workflow_execution_started_event_attributes",
                  "activity_task_scheduled_event_attributes",
                  "activity_task_completed_event_attributes",
                  "workflow_execution_completed_event_attributes"):
        if event.HasField(field):
            attrs = getattr(event, field)
            holder = attrs.input if hasattr(attrs, "input") else attrs.result
            return list(holder.payloads)
    return []


def test_codec_server_decodes_for_the_web_ui():
    codec = EncryptionCodec(bytes(range(32)))
    sealed = codec.encrypt(Payload(metadata={"encoding": b"json/plain"}, data=b'"hello"'))
    port = free_port()
    server = codec_server(codec, port, ui_origin="http://127.0.0.1:8233")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        from google.protobuf import json_format

        body = json_format.MessageToJson(Payloads(payloads=[sealed])).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/decode", data=body,
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:8233"
            decoded = json_format.Parse(response.read(), Payloads())
        assert decoded.payloads[0].data == b'"hello"'
    finally:
        server.shutdown()


def test_tls_mtls_and_api_key_options(tmp_path, monkeypatch):
    (tmp_path / "ca.pem").write_bytes(b"CA")
    (tmp_path / "client.pem").write_bytes(b"CERT")
    (tmp_path / "client.key").write_bytes(b"KEY")
    plain = client_options(TemporalConfig())
    assert plain["tls"] is False and plain["api_key"] is None
    mtls = client_options(TemporalConfig(
        address="temporal.example:7233", tls=True, tls_ca_path=str(tmp_path / "ca.pem"),
        tls_cert_path=str(tmp_path / "client.pem"), tls_key_path=str(tmp_path / "client.key"),
        tls_server_name="temporal.example"))
    assert mtls["tls"] == TLSConfig(server_root_ca_cert=b"CA", client_cert=b"CERT",
                                    client_private_key=b"KEY", domain="temporal.example")
    monkeypatch.setenv("ROLLART_TEMPORAL_API_KEY", "key-123")
    cloud = client_options(TemporalConfig(api_key_env="ROLLART_TEMPORAL_API_KEY"))
    assert cloud["api_key"] == "key-123" and cloud["tls"] is True
    monkeypatch.delenv("ROLLART_TEMPORAL_API_KEY")
    with pytest.raises(ValueError, match="ROLLART_TEMPORAL_API_KEY"):
        client_options(TemporalConfig(api_key_env="ROLLART_TEMPORAL_API_KEY"))
    with pytest.raises(ValueError, match="tls_cert_path and tls_key_path"):
        client_options(TemporalConfig(tls=True, tls_cert_path=str(tmp_path / "client.pem")))


@pytest.mark.asyncio(loop_scope="session")
async def test_workers_run_over_mtls_and_bad_certificates_are_refused(temporal_server, engine,
                                                                      tmp_path):
    pki = make_pki(tmp_path / "pki")
    untrusted = make_pki(tmp_path / "other", "other-ca")
    async with tls_proxy(temporal_server.address, pki, require_client_cert=True) as address:
        config = make_config(temporal_server, tmp_path / "run", **{
            "temporal.address": address, "temporal.tls": True,
            "temporal.tls_ca_path": str(pki["ca"]), "temporal.tls_server_name": "localhost",
            "temporal.tls_cert_path": str(pki["client_cert"]),
            "temporal.tls_key_path": str(pki["client_key"]), "domains.frozenlake.max_turns": 3})
        spec = TrajectorySpec.for_domain(config, "frozenlake", "over-mtls-1", "g", seed=1)
        async with in_process_fleet(config, engine, ("control", "env", "reward", "gen")) as client:
            result = await client.execute_workflow(
                TrajectoryWorkflow.run, spec, id=spec.trajectory_id,
                task_queue=config.temporal.control_queue, result_type=TrajectoryResult)
        assert result.status == "completed" and result.turns >= 1

        refused = {
            "no client certificate": {"tls_cert_path": None, "tls_key_path": None},
            "a server certificate from an untrusted CA": {"tls_ca_path": str(untrusted["ca"])},
            "a client certificate from an untrusted CA": {
                "tls_cert_path": str(untrusted["client_cert"]),
                "tls_key_path": str(untrusted["client_key"])},
            "no TLS": {"tls": False, "tls_ca_path": None, "tls_server_name": None,
                       "tls_cert_path": None, "tls_key_path": None},
        }
        for case, update in refused.items():
            with pytest.raises(ConnectionError, match=f"cannot reach a Temporal server at "
                                                      f"{address}"):
                await asyncio.wait_for(connect(config.temporal.model_copy(update=update)), 30)
                pytest.fail(f"connected with {case}")


def test_secrets_stay_out_of_the_serialized_config(tmp_path):
    from rollart.config import load_config

    config = load_config(None, **{"storage.secret_access_key": "s3-secret",
                                  "storage.access_key_id": "AKIA-ID",
                                  "temporal.api_key_env": "SOME_VAR"})
    dumped = config.model_dump_json()
    assert "s3-secret" not in dumped and "AKIA-ID" not in dumped
    assert "s3-secret" not in repr(config)
    assert json.loads(dumped)["temporal"]["api_key_env"] == "SOME_VAR"  # a name, not a secret

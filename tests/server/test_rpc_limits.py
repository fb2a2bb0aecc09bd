"""The gRPC server's server-wide limits, as a real server configures them (issue 35)."""

from __future__ import annotations

from pathlib import Path

import pytest

from liftlog.client import Client, LiftlogError

from .conftest import in_process_server


async def test_requests_are_capped_near_what_can_be_stored_with_a_clear_error(tmp_path: Path, nats_url: str) -> None:
    server = in_process_server(tmp_path / "a", nats_url, "rpc-limits")
    await server.start()
    try:
        rpc = server.rpc_server
        assert rpc is not None
        limits = rpc.options.limits
        # streams.max.message.bytes and the NATS max payload are both 1 MiB here: plus 64 KiB of framing.
        assert limits.max_message_bytes == (1 << 20) + (64 << 10)
        assert rpc.options.idle_timeout == 600 and rpc.options.max_connections == 10_000
        async with Client(server.address) as client:
            await client.create_stream("big", "big")
            ack = await client.publish("big", b"x" * ((1 << 20) - 1024), key=b"k" * 100)  # near both limits
            assert ack is not None and ack.offset == 0
            with pytest.raises(LiftlogError, match=r"larger than max .*streams.max.message.bytes \(1048576 bytes\)"):
                await client.publish("big", b"x" * (64 << 20))
            assert (await client.fetch_partition_metadata("big")).high_watermark == 0, "nothing more stored"
    finally:
        await server.stop()

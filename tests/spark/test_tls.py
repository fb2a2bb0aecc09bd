"""The Spark source and sink over mTLS: executors open their own TLS connections from the options."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from liftlog.client import Client, TlsConfig
from tests.integration.harness import LiftlogProcess, NatsProcess
from tests.integration.test_api_tls import make_pki, tls_server

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def mtls(
    tmp_path_factory: pytest.TempPathFactory, spark_nats: NatsProcess
) -> Iterator[tuple[LiftlogProcess, dict[str, str]]]:
    root = tmp_path_factory.mktemp("spark-tls")
    pki = make_pki(root / "pki")
    cert, key = pki.issue("client", "spark.example")
    proc = tls_server(
        root, spark_nats, pki.issue("server"), "tls.client.auth.enabled=true", f"tls.client.auth.ca={pki.ca_file}"
    )
    yield proc, {"tls.ca": pki.ca_file, "tls.cert": cert, "tls.key": key}
    proc.kill()


def test_spark_reads_and_writes_over_mtls(
    spark: Any, mtls: tuple[LiftlogProcess, dict[str, str]], stream_name: str
) -> None:
    server, tls = mtls
    config = TlsConfig(ca=tls["tls.ca"], cert=tls["tls.cert"], key=tls["tls.key"])

    async def create() -> None:
        async with Client(server.address, tls=config) as client:
            await client.create_stream(stream_name, stream_name, partitions=2)

    asyncio.run(create())
    rows = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(100)], "key string, value string")
    rows.write.format("liftlog").option("servers", server.address).option("stream", stream_name).options(**tls).mode(
        "append"
    ).save()
    df = spark.read.format("liftlog").option("servers", server.address).option("stream", stream_name).options(**tls)
    values = sorted(r.value.decode() for r in df.load().collect())
    assert values == sorted(f"v{i}" for i in range(100))


def test_spark_without_the_client_certificate_fails_clearly(
    spark: Any, mtls: tuple[LiftlogProcess, dict[str, str]], tmp_path: Path
) -> None:
    server, tls = mtls
    df = spark.read.format("liftlog").option("servers", server.address).option("stream", "any")
    with pytest.raises(Exception, match="requires client certificates"):
        df.option("tls.ca", tls["tls.ca"]).load().count()

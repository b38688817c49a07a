"""``benchmarks/request_count``: a process started with it on ``PYTHONPATH`` counts its Kafka
requests against the real broker, and the reader adds them up per process kind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.request_count.__main__ import by_kind, main
from infra.broker import LocalBroker
from infra.topics import TopicAdmin

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import asyncio, sys
    from aiokafka import AIOKafkaProducer

    async def produce(bootstrap, topic):
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for i in range(5):  # one at a time: five requests of one record
                await producer.send_and_wait(topic, b"one", partition=0)
            sent = [await producer.send(topic, b"together", partition=0) for _ in range(3)]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()

    asyncio.run(produce(sys.argv[1], sys.argv[2]))
""")


async def test_a_process_counts_its_requests_and_the_records_of_each_stream(
    broker: LocalBroker, unique: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = f"test.t.counted{unique}.observations"
    async with TopicAdmin(broker.settings) as admin:
        await admin.ensure_topic(topic, 1)
    script = tmp_path / "producer_child.py"
    script.write_text(CHILD)
    env = {**os.environ, "JOYNEXUS_REQUEST_COUNT_DIR": str(tmp_path / "counts"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks" / "request_count"), str(ROOT)])}
    subprocess.run([sys.executable, str(script), broker.bootstrap, topic], env=env, check=True,
                   timeout=120)

    counts = by_kind(tmp_path / "counts")["producer_child"]
    assert counts["records observations"] == 8
    assert counts["produce carrying 01"] >= 5  # the five sent one at a time
    assert 2 <= counts["request ProduceRequest"] <= 8
    assert sum(n for k, n in counts.items() if k.startswith("produce carrying")) == \
        counts["request ProduceRequest"]
    assert counts["request MetadataRequest"] >= 1

    monkeypatch.setenv("COLUMNS", "200")  # rich truncates to 80 columns without a terminal
    main([str(tmp_path / "counts")])
    out = capsys.readouterr().out
    assert "producer_child" in out and "observations 8" in out


def test_without_the_variable_nothing_is_counted(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks" / "request_count")}
    env.pop("JOYNEXUS_REQUEST_COUNT_DIR", None)
    probe = "import aiokafka.conn as c; print(c.AIOKafkaConnection.send.__name__)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True,
                         text=True, timeout=60).stdout
    assert out.strip() == "send"


def test_the_reader_says_when_there_is_nothing_to_read(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path)])

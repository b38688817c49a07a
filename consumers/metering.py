"""The metering role: a faust-streaming app that folds ``UsageRecorded`` into per-tenant tables.

Source: ``<prefix>.usage`` (keyed by tenant), committed records only. Tables (in-memory, each
backed by a compacted changelog topic faust creates, ``<prefix>.metering-<table>-changelog``,
partitioned like the source):

* ``usage-totals``: tumbling windows of ``metering_window_s`` on each usage's own time
  (``window_end``), key tenant, value ``{"<role>|<resource>": [seconds, steps, events],
  "ids": [usage ids counted in this window]}``.

Guarantee: at least once, with idempotent updates keyed by event id (faust's exactly-once mode
has open duplicate and crash defects: #517, #440, #323). An event whose id is already in its
window's ``ids`` is skipped, so a redelivery after a crash or a full replay of the usage topic
counts nothing twice, and neither does a re-published copy of an event (same id, same time,
same window). The sums and the ids are ONE value, so one changelog record carries both: there
is no moment where an event is counted but not remembered.
A window's ids grow with the events of one tenant in one window (tens per minute here).
Windows (and with them the remembered ids) expire after ``retention_ms``, the usage topic's own
retention, so any record still in the topic can be replayed without counting twice.

faust's at-least-once consumer reads uncommitted records; usage written inside aborted
transactions (a backbone-train or optimizer retry) must not count, so the consumer here reads
committed records only (``_CommittedConsumer``).

Query side: ``read_usage`` folds the totals changelog (latest value per tenant and window) from
any process, without joining the app's group; ``joynexus usage`` prints it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import faust
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka

from infra.connection import client_options
from infra.errors import SchemaError
from infra.logging import get_logger
from infra.settings import Settings
from infra.topics import shared_topic
from schemas import events as ev
from schemas.codec import Codec

__all__ = ["UsageRow", "app_id", "build_app", "read_usage", "run_worker", "totals_changelog"]

log = get_logger("consumers.metering")

IDS = "ids"  # in a window's value: the usage ids already counted in it


def app_id(settings: Settings) -> str:
    # Starts with the topic prefix: the service principal's ACLs (prefix `<prefix>.`) cover the
    # app's group and the changelog topics faust names after it.
    return f"{settings.topic_prefix}.metering"


def totals_changelog(settings: Settings) -> str:
    return f"{app_id(settings)}-usage-totals-changelog"


class _CommittedThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport):  # noqa: ANN001, ANN202 - faust's signature
        consumer = super()._create_worker_consumer(transport)
        # faust sets read_committed only in its exactly-once mode; aiokafka reads the attribute
        # when the consumer starts, which is after this.
        consumer._isolation_level = "read_committed"  # noqa: SLF001
        return consumer


class _CommittedConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> _CommittedThread:
        return _CommittedThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Consumer = _CommittedConsumer


def _credentials(settings: Settings) -> faust.SASLCredentials | None:
    options = client_options(settings)
    if "sasl_plain_username" not in options:
        return None
    return faust.SASLCredentials(username=options["sasl_plain_username"],
                                 password=options["sasl_plain_password"],
                                 mechanism=options["sasl_mechanism"])


def build_app(settings: Settings) -> faust.App:
    """The metering app (not started): its topic, tables and agent."""
    window = timedelta(seconds=settings.metering_window_s)
    keep = timedelta(milliseconds=settings.retention_ms)
    app = faust.App(
        app_id(settings),
        broker=[f"kafka://{server}" for server in settings.bootstrap.split(",")],
        broker_credentials=_credentials(settings),
        store="memory://",
        # faust keeps table metadata in a data directory; the default is the working directory
        datadir=str(settings.home / "metering"),
        processing_guarantee="at_least_once",
        topic_partitions=settings.partitions,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        # no other role's tables; faust's recovery of a fresh changelog must not wait long
        stream_recovery_delay=0.0,
    )
    app.transport = _Transport(app.conf.broker_consumer, app)
    source = app.topic(shared_topic(settings, "usage"), key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")
    codec = Codec.for_settings(settings)

    def event_time(event) -> float:  # noqa: ANN001 - a faust Event
        # The usage's own time, not the record's: a re-published copy of an event lands in the
        # same window as the original, where its id is remembered.
        try:
            return codec.decode(event.value).window_end.timestamp()
        except (SchemaError, AttributeError):
            return event.message.timestamp / 1000.0

    totals = app.Table("usage-totals", default=dict, partitions=settings.partitions
                       ).tumbling(window, expires=keep).relative_to(event_time)

    @app.agent(source)
    async def meter(stream):  # noqa: ANN001, ANN202 - a faust agent
        async for value in stream:
            try:
                usage = codec.decode(value)
            except SchemaError as exc:
                log.error("undecodable usage record skipped", error=str(exc)[:200], **_position())
                continue
            if not isinstance(usage, ev.UsageRecorded) or not usage.tenant_id:
                continue
            # value(), not current(): current() is always relative to the record's timestamp, whatever
            # relative_to says, and then reads another window than the write goes to
            current = dict(totals[usage.tenant_id].value())
            counted = current.get(IDS, [])
            if usage.usage_id in counted:
                log.info("usage already counted", tenant=usage.tenant_id, usage_id=usage.usage_id,
                         **_position())
                continue
            key = f"{usage.role}|{usage.resource}"
            seconds, steps, events = current.get(key, (0.0, 0, 0))
            current[key] = [seconds + usage.seconds, steps + usage.steps, events + 1]
            current[IDS] = [*counted, usage.usage_id]
            totals[usage.tenant_id] = current  # ONE write: the sums and the ids they counted

    return app


def _position() -> dict[str, object]:
    """Topic, partition and offset of the record the agent is handling, for its log lines."""
    event = faust.current_event()
    if event is None:
        return {}
    return {"topic": event.message.topic, "partition": event.message.partition,
            "offset": event.message.offset}


def run_worker(settings: Settings) -> None:
    """Run the metering app in this process until SIGTERM/SIGINT (faust's worker)."""
    app = build_app(settings)
    # faust would otherwise install its own plain-text log handler and re-log every line written to
    # stdout/stderr (our JSON lines included) as a WARNING of its own: the process keeps the
    # project's JSON logging, faust's records included, like every other role
    worker = faust.Worker(app, quiet=True, override_logging=False, redirect_stdouts=False)
    worker.spinner = None  # a terminal spinner's escape codes do not belong in a log of JSON lines
    worker.execute_from_commandline()


# --------------------------------------------------------------------------------- query side
@dataclass
class UsageRow:
    tenant: str
    window_start: datetime
    window_end: datetime
    by_resource: dict[str, list[float]] = field(default_factory=dict)  # key -> [seconds, steps, events]

    @property
    def seconds(self) -> float:
        return sum(v[0] for v in self.by_resource.values())

    @property
    def steps(self) -> int:
        return int(sum(v[1] for v in self.by_resource.values()))

    @property
    def events(self) -> int:
        return int(sum(v[2] for v in self.by_resource.values()))


async def read_usage(settings: Settings, tenant: str | None = None, window_s: int | None = None
                     ) -> list[UsageRow]:
    """The metering totals, from the totals changelog: per tenant and window (the table's own
    windows, or ``window_s``-wide ones summed from them; a multiple of the table's)."""
    base = settings.metering_window_s
    window_s = window_s or base
    if window_s % base:
        raise ValueError(f"--window must be a multiple of the metering window ({base} s)")
    latest: dict[tuple[str, float], dict[str, list[float]]] = {}
    for key, value in await _changelog(settings):
        name, (start, _end) = json.loads(key)
        if tenant is None or name == tenant:
            latest[(name, float(start))] = json.loads(value) if value else {}
    rows: dict[tuple[str, int], UsageRow] = {}
    for (name, start), by_resource in sorted(latest.items()):
        bucket = int(start // window_s * window_s)
        row = rows.setdefault((name, bucket), UsageRow(
            name, datetime.fromtimestamp(bucket, UTC), datetime.fromtimestamp(bucket + window_s, UTC)))
        for resource, sums in by_resource.items():
            if resource == IDS:
                continue
            seconds, steps, events = sums
            total = row.by_resource.setdefault(resource, [0.0, 0, 0])
            total[0] += seconds
            total[1] += steps
            total[2] += events
    return [rows[k] for k in sorted(rows)]


async def _changelog(settings: Settings) -> Iterable[tuple[bytes, bytes | None]]:
    topic = totals_changelog(settings)
    consumer = AIOKafkaConsumer(**client_options(settings), group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic)
        if parts is None:
            await consumer._client.force_metadata_update()  # noqa: SLF001 - a topic made moments ago
            parts = consumer.partitions_for_topic(topic)
        if not parts:
            return []
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[tuple[bytes, bytes | None]] = []
        pending = {tp for tp in tps if ends[tp] > 0}
        while pending:
            for tp, records in (await consumer.getmany(*pending, timeout_ms=500)).items():
                out.extend((r.key, r.value) for r in records if r.offset < ends[tp])
            pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
        return out
    finally:
        await consumer.stop()

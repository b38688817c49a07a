"""A consume-transform-produce worker for the crash tests, run as a subprocess:

    python -m tests.workers.relay INPUT OUTPUT GROUP

Each Heartbeat in becomes one Heartbeat out with the same sequence, through
``TransformWorker`` (exactly once). Settings come from JOYNEXUS_* variables.
"""

from __future__ import annotations

import asyncio
import sys
import time

from consumers.bus.protocols import Output, RecordContext
from consumers.bus.transform import TransformWorker
from infra.logging import configure_logging
from infra.settings import Settings
from schemas.events import Envelope, Event, Heartbeat


def make_transform(output: str):
    def relay(event: Event, ctx: RecordContext) -> list[Output]:
        assert isinstance(event, Heartbeat)
        time.sleep(0.01)  # some work, so a SIGKILL lands in the middle of a batch
        out = event.model_copy(update={"envelope": Envelope(correlation_id=event.envelope.event_id),
                                       "role": "relayed"})
        return [Output(output, out, key=str(event.sequence))]
    return relay


async def main(input_topic: str, output_topic: str, group: str) -> None:
    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    worker = TransformWorker(settings, group_id=group, topics=[input_topic],
                             transform=make_transform(output_topic), role="relay")
    await worker.start()
    try:
        await worker.run()
    finally:
        await worker.stop()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))

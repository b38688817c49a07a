"""Counts the Kafka requests of every Python process started with this folder on ``PYTHONPATH``.

``JOYNEXUS_REQUEST_COUNT_DIR=DIR PYTHONPATH=benchmarks/request_count python -m benchmarks.multi_tenant ...``:
each process (the benchmark, every role it starts, their children) writes ``DIR/<pid>.json`` every
few seconds and at exit: its command line, its requests by type (``ProduceRequest``,
``FetchRequest``...), its produce requests by how many records they carry, and the records it
produced per stream (the last part of the topic name: ``observations``, ``actions``...).
``python -m benchmarks.request_count DIR`` adds them up per process kind.

It wraps aiokafka's ``AIOKafkaConnection.send``, the one call every request goes through (a
private API: it measures, it is not part of the service, and it does nothing without the
variable). Record counts are read from each batch's header (a v2 record batch stores its record
count at byte 57, uncompressed whatever the codec).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import sys
import threading
import time

DIR = os.environ.get("JOYNEXUS_REQUEST_COUNT_DIR")
RECORD_COUNT_AT = 57
DUMP_EVERY_S = 5.0


def _install(out_dir: str) -> None:
    from aiokafka import conn

    counts: collections.Counter[str] = collections.Counter()
    send = conn.AIOKafkaConnection.send

    def counted(self, request, *args, **kwargs):
        name = type(request).__name__
        counts[f"request {name}"] += 1
        if name == "ProduceRequest":
            records = 0
            for topic, partitions in getattr(request, "_topics", ()):
                for _, batch in partitions:
                    n = int.from_bytes(bytes(batch[RECORD_COUNT_AT:RECORD_COUNT_AT + 4]), "big")
                    counts[f"records {topic.rsplit('.', 1)[-1]}"] += n
                    records += n
            counts[f"produce carrying {min(records, 16):02d}"] += 1
        return send(self, request, *args, **kwargs)

    conn.AIOKafkaConnection.send = counted
    path = os.path.join(out_dir, f"{os.getpid()}.json")

    def dump() -> None:
        snapshot = dict(counts)  # one C-level copy: the event loop's thread may add a key meanwhile
        with open(path + ".tmp", "w") as f:
            json.dump({"argv": sys.argv, "counts": snapshot}, f)
        os.replace(path + ".tmp", path)

    def every() -> None:
        while True:
            time.sleep(DUMP_EVERY_S)
            with contextlib.suppress(OSError):  # a full disk or a removed folder: try again later
                dump()

    atexit.register(dump)  # a normal exit writes the final counts; after a SIGKILL the last dump stands
    threading.Thread(target=every, name="request-count", daemon=True).start()


if DIR:
    os.makedirs(DIR, exist_ok=True)
    with contextlib.suppress(ImportError):  # a process without aiokafka has nothing to count
        _install(DIR)

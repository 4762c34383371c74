"""A consumer role for the crash test: processes tasks slowly, logging 'polled'/'done' per record.

Run as ``python tests/backbone/consumer_child.py GROUP LOGFILE`` with the config in the env.
"""
from __future__ import annotations

import sys
import time

from cluster.bus.client import Bus
from cluster.config import load
from schemas import topics as T


def main(group: str, logfile: str) -> None:
    bus = Bus(load(), client_id="child")
    consumer = bus.consumer([T.TASKS], group_id=group)
    with open(logfile, "a", buffering=1) as log:
        log.write("started\n")
        while True:
            records = consumer.poll(timeout_s=0.2)
            for rec in records:
                log.write(f"polled {rec.msg.task_id}\n")
            for rec in records:
                time.sleep(0.1)  # the "work"
                consumer.commit(rec)
                log.write(f"done {rec.msg.task_id}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

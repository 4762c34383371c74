"""The actor's weight follower on a thread of its own (its own event loop), for tests with a stand-in engine."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from cluster.bus.client import Bus


def follow(cfg, engine, dest: Path, actor_id: str = "actor-b"):
    """(WeightFollower, stop()): the follower runs until stop() (which also closes its bus)."""
    from actors.weights import WeightFollower

    bus = Bus(cfg, client_id=actor_id)
    follower = WeightFollower(bus, cfg, engine, actor_id, dest)
    ready, box = threading.Event(), {}

    async def main():
        box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
        ready.set()
        await follower.run(box["stop"])

    th = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    th.start()
    ready.wait(10)

    def stop():
        box["loop"].call_soon_threadsafe(box["stop"].set)
        th.join(30)
        bus.close()

    return follower, stop

"""`kernelrl up`'s watch over the embedded broker it started: a dead broker is restarted on the same port
and data directory (its log is durable), and every outage is counted for the run report.

The roles are never told: their Kafka clients reconnect to the same address once the broker serves again.
"""
from __future__ import annotations

import copy
import logging
import os
import signal
import time

from cluster.errors import KernelRLError

log = logging.getLogger(__name__)


class BrokerLost(KernelRLError):
    """The embedded broker died and could not be brought back on its address: the run cannot go on."""

    retriable = False


class BrokerWatch:
    """Call ``check()`` from the run's loop; ``kill()`` is chaos's SIGKILL of the JVM."""

    def __init__(self, cfg, owned: bool, restart_timeout_s: float = 120.0) -> None:
        from cluster.broker import embedded as broker

        self.cfg, self.owned, self.restart_timeout_s = cfg, owned, restart_timeout_s
        st = broker.status(cfg) if owned else {}
        self.port = st.get("port", 0)
        self.restarts: list[dict] = []
        self.kills = 0
        self.down_since: float | None = None

    def alive(self) -> bool:
        from cluster.broker import embedded as broker

        return not self.owned or broker.status(self.cfg)["running"]

    def check(self) -> bool:
        """Restart the broker if it died; True when it did. Raises BrokerLost when it cannot."""
        if self.alive():
            return False
        self.down_since = self.down_since or time.time()
        log.warning("the embedded Kafka broker is down: restarting it on port %d with its data", self.port)
        self._restart()
        outage = time.time() - self.down_since
        self.restarts.append({"at": self.down_since, "outage_s": round(outage, 2)})
        log.warning("the embedded Kafka broker is back after %.1f s", outage)
        self.down_since = None
        return True

    def _restart(self) -> None:
        from cluster.broker import embedded as broker

        pinned = copy.deepcopy(self.cfg)
        pinned.broker.port = self.port  # the roles know this address: never come back on another
        deadline = time.monotonic() + self.restart_timeout_s
        while True:
            try:
                broker.start(pinned, tie_to_parent=True)
                return
            except KernelRLError as exc:
                # the killed JVM's port can take a moment to be released; other failures repeat until the deadline
                if time.monotonic() > deadline:
                    raise BrokerLost(f"the embedded broker died and did not restart on port {self.port} "
                                     f"within {self.restart_timeout_s:.0f} s: {exc}") from exc
                log.warning("broker restart failed (%s); retrying", exc)
                time.sleep(2.0)

    def kill(self) -> bool:
        """SIGKILL the broker's JVM (chaos); False when this run does not own one."""
        from cluster.broker import embedded as broker

        pid = broker.read_state(self.cfg).get("pid")
        if not self.owned or not broker.pid_alive(pid):
            return False
        os.kill(pid, signal.SIGKILL)
        self.kills += 1
        self.down_since = time.time()
        return True

    def pids(self) -> set[int]:
        """The broker JVM's pid while it runs (a child of this process, never an orphan to kill)."""
        from cluster.broker import embedded as broker

        pid = broker.read_state(self.cfg).get("pid") if self.owned else None
        return {pid} if pid else set()

    def status_line(self) -> str:
        if self.down_since is not None:
            return f"DOWN for {time.time() - self.down_since:.0f} s (restarting)"
        return f"up (restarts {len(self.restarts)})" if self.owned else "external"

    def report(self) -> dict:
        return {"broker_restarts": len(self.restarts), "broker_outages_s": [r["outage_s"] for r in self.restarts],
                "broker_chaos_kills": self.kills}

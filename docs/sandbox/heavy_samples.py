"""Where an honest ReLU's foreign CPU time comes from: the weight of every sample (its thread's CPU time since its
previous sample) and of each torch sample inside the judge's run windows, over N evaluations of
skills/examples/cpu_19_relu at its own shape. Usage: python docs/sandbox/heavy_samples.py N (from the repository
root, in the venv; the evaluator as the tests configure it)."""
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sandbox_workers import cpu_profile  # noqa: E402
from sandbox_workers.cpu_sampler import find  # noqa: E402
from tests.sandbox.conftest import fast_cfg  # noqa: E402

_foreign_time = cpu_profile.foreign_time


def _traced(prof, windows, own_file, skip_calls=2):
    out = _foreign_time(prof, windows, own_file, skip_calls)
    spans = sorted((w0, w1) for w0, w1, _ in windows)
    ws = sorted(s[2] for s in prof.samples)
    print("all weights us: median %.0f p90 %.0f p99 %.0f max %.0f n %d" % tuple(
        [ws[int(len(ws) * q)] / 1e3 for q in (0.5, 0.9, 0.99)] + [ws[-1] / 1e3, len(ws)]))
    torch = []
    for t, ip, w in prof.samples:
        m = find(prof.maps, ip)
        name = os.path.basename(m.path) if m else "?"
        if ("torch" in name or "c10" in name) and any(a <= t <= b for a, b in spans):
            torch.append((name, round(w / 1e3)))
    print("torch samples in the windows (library, us):", torch)
    return out


def main(n: int) -> None:
    from sandbox_workers.evaluator import Evaluator

    cpu_profile.foreign_time = _traced
    ev = Evaluator(fast_cfg(tempfile.mkdtemp()), "cpu")
    ex = ROOT / "skills/examples/cpu_19_relu"
    files = {str(p.relative_to(ex)): p.read_text() for p in ex.rglob("*") if p.is_file() and p.name != "model.py"}
    try:
        for _ in range(n):
            res = ev.evaluate((ex / "model.py").read_text(), files, mode="both")
            p = res["evidence"].get("cpu_profile") or {}
            print(json.dumps({k: p.get(k) for k in ("calls", "foreign_s", "foreign_samples", "foreign_per_call_s",
                                                    "foreign_kernel_s", "lost", "foreign_in")}), flush=True)
    finally:
        ev.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)

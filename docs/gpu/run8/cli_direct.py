"""Run the CLI exactly as tests/sandbox/test_cuda_build.py::test_cli_on_shipped_cuda_example does; save its raw stdout/stderr."""
import json, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, ".")
from tests.conftest import KERNELRL
from tests.sandbox.conftest import fast_sandbox
from tests.sandbox.helpers import ROOT, RELU_TASK, shrunk_task

out_dir, tag = Path(sys.argv[1]), sys.argv[2]
cache = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="krl-cache-")
tmp = Path(tempfile.mkdtemp())
task = tmp / "model.py"
task.write_text(shrunk_task(RELU_TASK[0], batch_size=256, dim=16384))
sets = [a for k, v in fast_sandbox(cache).items() for a in ("--set", f"sandbox.{k}={v}")]
cmd = [*KERNELRL, *sets, "sandbox", "eval", "--task", str(task), "--solution", str(ROOT / "skills/examples/cuda_19_relu"),
       "--backend", "cuda", "--json"]
t0 = time.time()
r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1200)
(out_dir / f"cli_{tag}.stdout").write_text(r.stdout)
(out_dir / f"cli_{tag}.stderr").write_text(r.stderr)
print(f"{tag}: rc={r.returncode} wall={time.time()-t0:.1f}s stdout_bytes={len(r.stdout)} cache={cache}")
try:
    o = json.loads(r.stdout)
    t = o.get("timings", {})
    print(json.dumps({"reward": o.get("reward"), "correct": o.get("correct"), "error": o.get("error", "")[:2000],
                      "violations": o.get("violations"), "second_opinion": o.get("evidence", {}).get("second_opinion"),
                      **{k: {kk: v.get(kk) for kk in ("n", "batch", "median_s", "trusted")} for k, v in t.items() if isinstance(v, dict)}}, indent=1))
except Exception as exc:
    print("stdout is not JSON:", repr(exc), repr(r.stdout[:3000]))

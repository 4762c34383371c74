# The GEMM example, honest and with its claims' clock at 1/100 (session 18, docs/sandbox.md "Who computed: the CPU
# profile"): claim, judged estimate, profiled floor, paid time. Usage: python docs/sandbox/cpu_profile_forged_gemm.py
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, ".")  # run from the repository root
from sandbox_workers.evaluator import Evaluator
from tests.sandbox import redteam_cases as rc
from tests.sandbox.conftest import fast_cfg

cfg = fast_cfg(tempfile.mkdtemp())
cfg.sandbox.static_guards = False
ex = Path("skills/examples/cpu_12_Gemm_Multiply_LeakyReLU")
honest = {str(p.relative_to(ex)): p.read_text() for p in ex.rglob("*") if p.is_file() and p.name != "model.py"}
forged = dict(honest, **{"model_new.py": rc._SCALE_CLOCK + "\n" + honest["model_new.py"]})
ev = Evaluator(cfg, "cpu")
for name, files in (("honest", honest), ("forged_clock_1/100", forged)):
    res = ev.evaluate((ex / "model.py").read_text(), files, mode="both")
    e, tm = res["evidence"], res["timings"]
    print(name, "reward", res["reward"], "claim_ms %.3f" % (1e3 * tm["candidate"]["median_s"]),
          "judged_ms %.3f" % (1e3 * e.get("judged_time_s", 0)), "profiled_ms %.3f" % (1e3 * e.get("profiled_time_s", 0)),
          "reward_time_ms %.3f" % (1e3 * e.get("reward_time_s", 0)), "eager_ms %.3f" % (1e3 * tm["eager"]["median_s"]),
          "compile_ms %.3f" % (1e3 * tm["compile"]["median_s"]),
          "library_s", e["cpu_profile"]["library_s"], "calls", e["cpu_profile"]["calls"])
ev.close()

"""Reference child: expected outputs for several seeds, saved for the candidate; eager/compile baselines."""
from __future__ import annotations

import inspect
import os
import time

import torch

from sandbox_workers.backends import get_runtime
from sandbox_workers.runner_common import (flatten_outputs, input_digest, load_task, make_inputs, make_prepare,
                                           record_output, seed_all, timing_pool, versions)


def run_reference(spec: dict) -> dict:
    backend = spec["backend"]
    runtime = get_runtime(backend, **spec.get("runtime", {}))
    device = runtime.device
    task = load_task(spec["task_source"])
    seed = int(spec["seed"])
    seed_all(seed)
    init_inputs = list(task.get_init_inputs())
    seed_all(seed)
    model = task.Model(*init_inputs).to(device).eval()
    trials = []
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(6), "little"))
    max_full, samples = int(spec.get("max_full_elems", 1 << 22)), int(spec.get("sample_elems", 1 << 20))
    save = spec.get("save_data", True)
    with torch.no_grad():
        for s in (spec["trial_seeds"] if save else spec["trial_seeds"][:1]):  # baselines-only: one trial
            inputs = make_inputs(task.get_inputs, int(s), device)
            outs = flatten_outputs(model(*inputs))
            trials.append({"seed": int(s), "input_digest": input_digest(inputs),
                           "outputs": [record_output(o, max_full, samples, gen) for o in outs]})
            del inputs, outs
    sig = [p for p in inspect.signature(task.Model.__init__).parameters if p != "self"]
    data = {"init_inputs": init_inputs, "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "trials": trials, "ctor_params": sig}
    if save:  # atomically: candidates of other workers may be reading it
        tmp = spec["data_path"] + f".tmp{os.getpid()}"
        torch.save(data, tmp)
        os.replace(tmp, spec["data_path"])
    result = {"ok": True, "versions": versions(runtime), "clock": runtime.clock_info(),
              "outputs": [[o["shape"], o["dtype"]] for o in trials[0]["outputs"]], "baselines": {}}
    if spec.get("timing"):
        result["baselines"] = _baselines(model, task.get_inputs, spec["trial_seeds"], runtime, spec)
    return result


def _baselines(model, get_inputs, seeds, runtime, spec) -> dict:
    tcfg = spec["timing"]
    pool = timing_pool(get_inputs, seeds, runtime.device)
    live = [x.clone() if isinstance(x, torch.Tensor) else x for x in pool[0]]
    out = {}
    variants = [("eager", model)]
    if spec.get("compile_baseline", True):
        variants.append(("compile", torch.compile(model)))
    with torch.no_grad():
        for name, fn_model in variants:
            t0 = time.monotonic()
            try:
                fn_model(*live)  # first call: torch.compile compiles here, outside the timed region
                runtime.sync()
            except Exception as exc:  # noqa: BLE001 - a task inductor cannot compile keeps the eager baseline
                out[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                continue
            warm_s = time.monotonic() - t0
            stats = runtime.time_callable(lambda m=fn_model: m(*live), prepare=make_prepare(live, pool), **tcfg)
            stats["first_call_s"] = warm_s
            out[name] = stats
    return out

#!/usr/bin/env bash
# Session 13's runs (docs/oracle-gpu.md, "the reference time taken from the baselines"): open-loop stress at $RATE
# requests/s. The script grew into docs/gpu/run16/run16.sh (closed loop by default, the stress `timeline`); this runs
# it with session 13's open loop. Example: OUT=$OUT STEPS="warm count:4" EX="1*" STRESS_S=60 RATE=0.5 bash docs/gpu/run13/run13.sh
RATE=${RATE:-0.8} exec bash "$(dirname "$0")/../run16/run16.sh" "$@"

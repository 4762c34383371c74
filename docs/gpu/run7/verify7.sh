#!/bin/bash
# session 7, after the fix: timing red team + the CLI test + repeated CLI runs; everything tarred into $OUT/verify.tgz
export PATH=$PWD/.device/issue11/bin:$PATH PYTHONUNBUFFERED=1
set -o pipefail
T0=$(date +%s); O=/tmp/v7; rm -rf $O; mkdir -p $O
el() { echo $(( $(date +%s) - T0 )); }
{ echo "+ timeout 200 python3 -m pytest -m gpu tests/sandbox -v --tb=long -rA --durations=10 -p no:cacheprovider -k 'side_stream_python or elapsed_time_scaled or event_class_replaced or honest-after-cuda_timing or cli_on_shipped'"
  timeout 200 python3 -m pytest -m gpu tests/sandbox -v --tb=long -rA --durations=10 -p no:cacheprovider -k 'side_stream_python or elapsed_time_scaled or event_class_replaced or honest-after-cuda_timing or cli_on_shipped'
  echo "rc=$? wall=$(el)s"; } > $O/pytest_fix.log 2>&1
tar czf $OUT/verify.tgz -C $O .
i=0
while [ $(el) -lt ${STOP_S:-250} ]; do i=$((i+1))
  timeout 80 python3 .device/issue11/cli_direct.py $O fix$i >> $O/cli_repeat_fix.log 2>&1; echo "rc=$? at $(el)s" >> $O/cli_repeat_fix.log; tar czf $OUT/verify.tgz -C $O .
done
tar czf $OUT/verify.tgz -C $O .
tail -5 $O/pytest_fix.log; grep -E "^fix|reward|second|error\": \"the" $O/cli_repeat_fix.log

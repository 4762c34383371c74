"""Per-test wall times of a pytest run read back from its temp folders' creation order (pytest-of-<user>/pytest-N):
each test with a tmp_path makes '<name>current' then '<name>0'; the gap to the next folder is that test plus any
test between them without one. Usage: python docs/ci/tmpdir_gaps.py /tmp/pytest-of-root/pytest-64 [min_s]"""
import os
import sys
import time

root, least = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 20
rows = sorted((os.stat(os.path.join(root, n)).st_mtime, n) for n in os.listdir(root))
print(f"first {time.strftime('%H:%M:%S', time.gmtime(rows[0][0]))} last {time.strftime('%H:%M:%S', time.gmtime(rows[-1][0]))}"
      f" span {rows[-1][0] - rows[0][0]:.0f} s, {len(rows)} folders")
for (t, n), (t2, n2) in zip(rows, rows[1:]):
    if t2 - t >= least:
        print(f"{time.strftime('%H:%M:%S', time.gmtime(t))} {t2 - t:6.0f} s  {n} -> {n2}")

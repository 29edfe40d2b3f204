"""Sums the logs of fuzz/campaign.sh into the campaign table of docs/reliability.md.

Each log is one fork-mode libFuzzer run of one target; its last status line
  #N: cov: C ft: F corp: K exec/s E oom/timeout/crash: O/T/X time: Ss job: J ...
gives the executions (N), the coverage reached (C edges, F features), the corpus size and the findings, and
"INFO: exiting: 0 time: Ss" the wall time. Per target the table adds up time, executions and findings over
all runs and reports the highest coverage (every run of a target continues the same working corpus).
usage: python3 tools/fuzz/campaign_table.py [/work/fuzz-campaign/logs]
"""

import re
import sys
from collections import defaultdict
from pathlib import Path

STATUS = re.compile(r"^#(\d+): cov: (\d+) ft: (\d+) corp: (\d+) exec/s \d+ oom/timeout/crash: (\d+)/(\d+)/(\d+) "
                    r"time: (\d+)s")
EXIT = re.compile(r"^INFO: exiting: \d+ time: (\d+)s")


def main():
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/fuzz-campaign/logs")
    totals = defaultdict(lambda: {"runs": 0, "seconds": 0, "execs": 0, "cov": 0, "ft": 0, "corp": 0,
                                  "oom": 0, "timeout": 0, "crash": 0})
    for log in sorted(folder.glob("*.log")):
        target = log.name.split(".")[0]
        last, seconds = None, None
        for line in log.read_text(errors="replace").splitlines():
            if m := STATUS.match(line):
                last = m
            elif m := EXIT.match(line):
                seconds = int(m.group(1))
        if last is None:
            continue
        t = totals[target]
        t["runs"] += 1
        t["seconds"] += seconds if seconds is not None else int(last.group(8))
        t["execs"] += int(last.group(1))
        t["cov"] = max(t["cov"], int(last.group(2)))
        t["ft"] = max(t["ft"], int(last.group(3)))
        t["corp"] = int(last.group(4))
        for key, group in (("oom", 5), ("timeout", 6), ("crash", 7)):
            t[key] += int(last.group(group))
    print("| target | runs | hours | executions | coverage (edges / features) | corpus | crashes / timeouts / OOMs |")
    print("|---|---:|---:|---:|---|---:|---|")
    for target, t in totals.items():
        print(f"| {target} | {t['runs']} | {t['seconds'] / 3600:.2f} | {t['execs']:,} | {t['cov']:,} / {t['ft']:,} | "
              f"{t['corp']:,} | {t['crash']} / {t['timeout']} / {t['oom']} |")


if __name__ == "__main__":
    main()

"""The fuzzing campaign's record: turns fuzz/campaign.sh's logs into rows of fuzz/campaign/*.tsv, and sums those
rows into the campaign table of docs/reliability.md.

Logs live on the machine that fuzzed and go with it; the rows are committed, so the table can be summed again
by anyone, over every session of the campaign.

Each log is one fork-mode libFuzzer run of one target; its last status line
  #N: cov: C ft: F corp: K exec/s E oom/timeout/crash: O/T/X time: Ss job: J ...
gives the executions (N), the coverage reached (C edges, F features), the corpus size and the findings, and
"INFO: exiting: 0 time: Ss" the wall time. A row holds one run (or, for runs whose logs were lost, the totals of
several: its `runs` column says how many). Per target the table adds up runs, time, executions and findings over
all rows and reports the highest coverage reached.

usage:
  python3 tools/fuzz/campaign_table.py rows LOG_FOLDER HOST > fuzz/campaign/<date>.tsv
  python3 tools/fuzz/campaign_table.py table fuzz/campaign/*.tsv
"""

import csv
import re
import sys
from collections import defaultdict
from pathlib import Path

STATUS = re.compile(r"^#(\d+): cov: (\d+) ft: (\d+) corp: (\d+) exec/s \d+ oom/timeout/crash: (\d+)/(\d+)/(\d+) "
                    r"time: (\d+)s")
EXIT = re.compile(r"^INFO: exiting: \d+ time: (\d+)s")
COLUMNS = ["target", "run", "runs", "seconds", "executions", "edges", "features", "corpus", "crashes", "timeouts",
           "ooms", "host"]
SUMMED = ["runs", "seconds", "executions", "crashes", "timeouts", "ooms"]
HIGHEST = ["edges", "features", "corpus"]


def rows_from_logs(folder, host):
    """One row per log that reached a status line; a log without one (a run killed at once) adds nothing."""
    rows = []
    for log in sorted(Path(folder).glob("*.log")):
        target, run = log.name.split(".")[0], log.name.split(".")[1]
        last, seconds = None, None
        for line in log.read_text(errors="replace").splitlines():
            if m := STATUS.match(line):
                last = m
            elif m := EXIT.match(line):
                seconds = int(m.group(1))
        if last is None:
            continue
        rows.append({"target": target, "run": run, "runs": 1,
                     "seconds": seconds if seconds is not None else int(last.group(8)),
                     "executions": int(last.group(1)), "edges": int(last.group(2)), "features": int(last.group(3)),
                     "corpus": int(last.group(4)), "crashes": int(last.group(7)), "timeouts": int(last.group(6)),
                     "ooms": int(last.group(5)), "host": host})
    return rows


def read_rows(paths):
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                missing = [c for c in COLUMNS if c not in row]
                if missing:
                    sys.exit(f"{path}: a row lacks the columns {missing} (expected {COLUMNS})")
                rows.append(row)
    return rows


def table(rows):
    totals = defaultdict(lambda: dict.fromkeys(SUMMED + HIGHEST, 0))
    for row in rows:
        t = totals[row["target"]]
        for key in SUMMED:
            t[key] += int(row[key])
        for key in HIGHEST:
            t[key] = max(t[key], int(row[key]))
    lines = ["| target | runs | hours | executions | coverage (edges / features) | largest corpus | "
             "crashes / timeouts / OOMs |",
             "|---|---:|---:|---:|---|---:|---|"]
    for target in sorted(totals):
        t = totals[target]
        lines.append(f"| {target} | {t['runs']} | {t['seconds'] / 3600:.2f} | {t['executions']:,} | "
                     f"{t['edges']:,} / {t['features']:,} | {t['corpus']:,} | "
                     f"{t['crashes']} / {t['timeouts']} / {t['ooms']} |")
    return "\n".join(lines)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "rows":
        writer = csv.DictWriter(sys.stdout, COLUMNS, delimiter="\t", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows_from_logs(sys.argv[2], sys.argv[3]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "table":
        print(table(read_rows(sys.argv[2:])))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

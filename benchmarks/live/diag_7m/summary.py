# ruff: noqa  # issue 7m diagnosis scripts, kept as they ran (results/diag-7m.md)
import glob
import json
import os
import sys

print(
    "| batch | placement | pid | trained % | worker actions per trained item, ms | loop CPU per item, ms | executor thread: voluntary / involuntary switches | loop thread: voluntary / involuntary |"
)
print("|---|---|---|---|---|---|---|---|")
for d, what in [a.split(":") for a in sys.argv[1:]]:
    proc = json.load(open(f"/tmp/7m/{d}/proc.json"))
    for path in sorted(glob.glob(f"/tmp/7m/{d}/t-*.jsonl"), key=os.path.getmtime):
        pid = path.split("t-")[1].split(".")[0]
        m = [json.loads(l) for l in open(path)]
        m = [r for r in m if "event" in r][-600:]
        tr = sum(r["skipped"] is None for r in m)
        act = m[-1]["executor_s"] - m[0]["executor_s"]
        cpu = (m[-1]["cpu"] - m[0]["cpu"]) / len(m)
        tasks = proc[pid]["tasks"]
        main = tasks[pid]
        ex = max((t for k, t in tasks.items() if k != pid), key=lambda t: t.get("voluntary_ctxt_switches", 0))
        print(
            f"| {d} | {what} | {pid} | {100 * tr / len(m):.0f} | {1000 * act / max(tr, 1):.2f} | {cpu:.2f} | {ex['voluntary_ctxt_switches']} / {ex['nonvoluntary_ctxt_switches']} | {main['voluntary_ctxt_switches']} / {main['nonvoluntary_ctxt_switches']} |"
        )

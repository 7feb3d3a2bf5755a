# ruff: noqa  # issue 7m diagnosis scripts, kept as they ran (results/diag-7m.md)
import json, glob, os, sys

d = sys.argv[1]
proc = json.load(open(f"/tmp/7m/{d}/proc.json"))
print(
    "| pid | trained % | actions wall / CPU per trained item, ms | per kind: n, wall/CPU ms per action | loop CPU/item ms | executor vol/invol |"
)
print("|---|---|---|---|---|---|")
for path in sorted(glob.glob(f"/tmp/7m/{d}/t-*.jsonl"), key=os.path.getmtime):
    pid = path.split("t-")[1].split(".")[0]
    m = [json.loads(l) for l in open(path)]
    m = [r for r in m if "event" in r][-600:]
    a, b = m[0], m[-1]
    tr = sum(r["skipped"] is None for r in m)
    kinds = sorted({k[:-2] for k in b if k.endswith("_n")})
    parts, wall, cpu = [], 0, 0
    for k in kinds:
        n = b[k + "_n"] - a.get(k + "_n", 0)
        w = b[k + "_wall"] - a.get(k + "_wall", 0)
        c = b[k + "_cpu"] - a.get(k + "_cpu", 0)
        wall += w
        cpu += c
        parts.append(f"{k} {n}: {1000 * w / max(n, 1):.2f}/{1000 * c / max(n, 1):.2f}")
    tasks = proc[pid]["tasks"]
    ex = max((t for k2, t in tasks.items() if k2 != pid), key=lambda t: t.get("voluntary_ctxt_switches", 0))
    print(
        f"| {pid} | {100 * tr / len(m):.0f} | {1000 * wall / tr:.2f} / {1000 * cpu / tr:.2f} | {'; '.join(parts)} | {(b['cpu'] - a['cpu']) / len(m):.2f} | {ex['voluntary_ctxt_switches']}/{ex['nonvoluntary_ctxt_switches']} |"
    )

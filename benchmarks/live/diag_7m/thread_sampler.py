# ruff: noqa  # issue 7m diagnosis scripts, kept as they ran (results/diag-7m.md)
"""Sidecar: sample /proc of every `ferret run` trainer process: per thread CPU, last CPU, ctxt switches."""

import glob, json, os, signal, sys, time, collections

out = sys.argv[1]
seen = {}  # pid -> {"cmd":..., "tasks": {tid: {...last}}, "cpus": {tid: Counter}}
stop = False
NICE = int(os.environ["NICE"]) if os.environ.get("NICE") else None
SPLIT = os.environ.get("PIN_SPLIT") == "1"
PIN = {0} if SPLIT else {int(c) for c in os.environ["PIN_CPUS"].split(",")} if os.environ.get("PIN_CPUS") else None


def h(*a):
    global stop
    stop = True


signal.signal(signal.SIGTERM, h)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


stat = []
while not stop:
    cpu = read("/proc/stat").splitlines()[0].split()[1:]
    stat.append([time.time()] + [int(x) for x in cpu])
    for p in glob.glob("/proc/[0-9]*"):
        pid = int(p[6:])
        if pid not in seen:
            c = read(p + "/cmdline")
            if not c or "services.cli.main" not in c or "\0run" not in c:
                continue
            seen[pid] = {
                "cmd": c.replace("\0", " ")[:200],
                "tasks": {},
                "cpus": collections.defaultdict(collections.Counter),
                "first": time.time(),
            }
        s = seen[pid]
        for t in glob.glob(p + "/task/*"):
            tid = t.rsplit("/", 1)[1]
            if NICE is not None and tid not in s.setdefault("niced", []):
                try:
                    os.setpriority(os.PRIO_PROCESS, int(tid), NICE)
                    s["niced"].append(tid)
                except OSError:
                    pass
            if PIN is not None and tid not in s.setdefault("pinned", []):
                try:
                    os.sched_setaffinity(int(tid), PIN if not SPLIT else ({1} if int(tid) == pid else {0}))
                    s["pinned"].append(tid)
                except OSError:
                    pass
            st = read(t + "/stat")
            ss = read(t + "/status")
            if not st or not ss:
                continue
            f = st[st.rindex(")") + 2 :].split()
            comm = st[st.index("(") + 1 : st.rindex(")")]
            d = {"comm": comm, "utime": int(f[11]), "stime": int(f[12]), "cpu": int(f[36])}
            for line in ss.splitlines():
                if "ctxt_switches" in line:
                    k, v = line.split(":")
                    d[k.strip()] = int(v)
            old = s["tasks"].get(tid)
            if old is None or d["utime"] + d["stime"] > old["utime"] + old["stime"]:
                s["cpus"][tid][d["cpu"]] += 1  # placement only while it ran
            s["tasks"][tid] = d
        s["last"] = time.time()
    time.sleep(0.1)
res = {str(k): {**v, "cpus": {t: dict(c) for t, c in v["cpus"].items()}} for k, v in seen.items()}
res["_stat"] = stat
json.dump(res, open(out, "w"))

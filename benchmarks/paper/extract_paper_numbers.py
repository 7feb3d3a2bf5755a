"""Extract the paper's numbers that `ferret bench` prints beside ours into paper_numbers.json.

Run once (the JSON is committed): ``.venv/bin/python -m benchmarks.paper.extract_paper_numbers``.
It reads ../shared/paper/ferret.tex, the tables named below, and keeps each cell as [mean, s.e.] with
the table label it came from. Setting names are mapped to ours (dataset/model); the gradient
compensation table has no row names: it sits beside the pipeline table with the same 20 rows, so its
rows are read in that table's order (stated in the JSON).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEX = HERE.parents[1] / ".." / "shared" / "paper" / "ferret.tex"

# paper row name -> our setting id (dataset/model)
SETTINGS = {
    "MNIST": "mnist/mnistnet",
    "FMNIST": "fashion-mnist/mnistnet",
    "EMNIST": "emnist/mnistnet",
    "CIFAR10": "cifar10/convnet",
    "Cifar10": "cifar10/convnet",
    "C10": "cifar10/convnet",
    "CIFAR100": "cifar100/convnet",
    "Cifar100": "cifar100/convnet",
    "C100": "cifar100/convnet",
    "SVHN": "svhn/convnet",
    "TinyImagenet": "tiny-imagenet/convnet",
    "TinyI": "tiny-imagenet/convnet",
    "CORe50": "core50/convnet",
    "CORe50-iid": "core50-iid/convnet",
    "SplitMNIST": "split-mnist/mnistnet",
    "S-MNIST": "split-mnist/mnistnet",
    "SplitFMNIST": "split-fashion-mnist/mnistnet",
    "S-FMNIST": "split-fashion-mnist/mnistnet",
    "SplitCIFAR10": "split-cifar10/convnet",
    "SplitCifar10": "split-cifar10/convnet",
    "S-C10": "split-cifar10/convnet",
    "SplitCIFAR100": "split-cifar100/convnet",
    "SplitCifar100": "split-cifar100/convnet",
    "S-C100": "split-cifar100/convnet",
    "SplitSVHN": "split-svhn/convnet",
    "S-SVHN": "split-svhn/convnet",
    "SplitTinyImagenet": "split-tiny-imagenet/convnet",
    "S-TinyI": "split-tiny-imagenet/convnet",
    "CLEAR10/ResNet": "clear10/resnet18",
    "CLEAR10/RNet": "clear10/resnet18",
    "CLEAR10/MobileNet": "clear10/mobilenet",
    "CLEAR10/MoNet": "clear10/mobilenet",
    "CLEAR100/ResNet": "clear100/resnet18",
    "CLEAR100/RNet": "clear100/resnet18",
    "CLEAR100/MobileNet": "clear100/mobilenet",
    "CLEAR100/MoNet": "clear100/mobilenet",
    "Covertype": "covertype/mlp",
}
METHOD_COLUMNS = ["oracle", "1-skip", "random-n", "last-n", "camel", "ferret-M-", "ferret-M", "ferret-M+"]
PIPELINE_COLUMNS = ["dapple", "zb", "hanayo-1w", "hanayo-2w", "hanayo-3w", "pipedream", "pipedream-2bw", "ferret-M"]
GC_COLUMNS = [f"{c}@{b}" for b in ("M+", "M") for c in ("step-aware", "gap-aware", "fisher", "iter-fisher")]
CELL = re.compile(r"(-?[\d.]+)\}?\s*\$_(?:\{\\pm\s*(-?[\d.]+)\}|\\pm\{(-?[\d.]+)\})\$")


def table_body(tex: str, label: str) -> list[str]:
    end = tex.index(f"\\label{{{label}}}")
    start = tex.rindex("\\midrule", 0, end)
    body = tex[start + len("\\midrule") : tex.index("\\bottomrule", start)]
    return [line.strip() for line in body.split("\\\\") if "$" in line]


def cells(line: str) -> list[list[float]]:
    return [[float(m.group(1)), float(m.group(2) or m.group(3))] for m in CELL.finditer(line)]


def setting_of(name: str) -> str:
    name = name.strip()
    if name in SETTINGS:
        return SETTINGS[name]
    head = name.split("/")[0]
    if head in SETTINGS:
        return SETTINGS[head]
    raise SystemExit(f"unknown paper setting {name!r}: add it to SETTINGS")


def by_setting(tex: str, label: str, columns: list[str]) -> dict[str, dict[str, list[float]]]:
    rows: dict[str, dict[str, list[float]]] = {}
    for line in table_body(tex, label):
        values = cells(line)
        if len(values) != len(columns):
            raise SystemExit(f"{label}: row {line[:40]!r} has {len(values)} cells, expected {len(columns)}")
        rows[setting_of(line.split("&")[0])] = dict(zip(columns, values, strict=True))
    return rows


def by_algorithm(tex: str, label: str, metrics: tuple[str, str]) -> dict[str, dict[str, dict[str, list[float]]]]:
    """{algorithm: {metric: {column: [mean, se]}}}; '-' cells (Camel) are absent."""
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    algorithm = ""
    for line in table_body(tex, label):
        first = line.split("&")[0]
        found = re.search(r"\{l\}\{(\w+)", first)
        if found:
            algorithm = found.group(1).lower()
        parts = line.split("&")[2:]
        named = re.search(r"\$(\w+)\$", line.split("&")[1])
        metric = named.group(1).lower() if named else ""
        if metric not in metrics:
            raise SystemExit(f"{label}: row {line[:40]!r} names metric {metric!r}, expected one of {metrics}")
        row = {}
        for column, part in zip(METHOD_COLUMNS, parts, strict=True):
            values = cells(part)
            if values:
                row[column] = values[0]
        out.setdefault(algorithm, {})[metric] = row
    return out


def main() -> int:
    tex = TEX.read_text()
    pipeline = by_setting(tex, "tab:pipeline-ablation", PIPELINE_COLUMNS)
    gc_lines = table_body(tex, "tab:gc-ablation")
    gc = {s: dict(zip(GC_COLUMNS, cells(line), strict=True)) for s, line in zip(pipeline, gc_lines, strict=True)}
    data = {
        "source": "../shared/paper/ferret.tex (Zhou et al., CVPR 2025); cells are [mean, standard error]",
        "tables": {
            "tab:overall-table": {
                "metric": "agm vs 1-Skip",
                "rows": by_setting(tex, "tab:overall-table", METHOD_COLUMNS),
            },
            "tab:add-online-acc": {"metric": "oacc (%)", "rows": by_setting(tex, "tab:add-online-acc", METHOD_COLUMNS)},
            "tab:underlying-A": {
                "metric": "agm/tagm vs 1-Skip, CORe50/ConvNet",
                "rows": by_algorithm(tex, "tab:underlying-A", ("agm", "tagm")),
            },
            "tab:add-underlying-A": {
                "metric": "oacc/tacc (%), CORe50/ConvNet",
                "rows": by_algorithm(tex, "tab:add-underlying-A", ("oacc", "tacc")),
            },
            "tab:pipeline-ablation": {"metric": "agm vs DAPPLE, no compensation", "rows": pipeline},
            "tab:gc-ablation": {
                "metric": "oacc(compensator) - oacc(none), Ferret M+ and M",
                "note": "the table has no row names; rows are read in tab:pipeline-ablation's order, "
                "beside which it is printed",
                "rows": gc,
            },
        },
    }
    out = HERE / "paper_numbers.json"
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Prints summary.txt from the four harness runs in this folder: per workload and local ratio,
gleaner with freed big blocks discarded at once (`--heap-retain 0`, the behaviour before) and
kept (the default), each against all-local and Linux swap measured in the same run."""

import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = [("off", 1), ("on", 1), ("off", 2), ("on", 2)]  # the order they ran in


def cells(path):
    d = json.load(open(path))
    for name, w in d["workloads"].items():
        for r in w["runs"]:
            if r["system"] == "gleaner" and r.get("ok"):
                yield name, r["ratio"], r


def main():
    rows = {}
    for variant, rep in RUNS:
        for name, ratio, r in cells(os.path.join(HERE, f"{variant}-{rep}.json")):
            g = r["gleaner"]
            rows.setdefault((name, ratio), {}).setdefault(variant, []).append({
                "s": r["metrics"]["seconds"],
                "x_local": r["vs_all_local"],
                "x_linux": r.get("vs_linux_swap"),
                "zero_fill": g["zero_fill_faults"],
                "remote": g["remote_faults"],
                "moved_mib": (g["bytes_in"] + g["bytes_out"]) / 2**20,
                "cpu_s": r["cpu_total_s"],
            })
    out = []
    fmt = lambda xs: "/".join(f"{x:.2f}" if isinstance(x, float) else str(x) for x in xs)
    out.append("workload  local  variant          wall s      x all-local  x Linux swap  "
               "zero-fill faults  remote faults  moved MiB  CPU s")
    for (name, ratio), v in sorted(rows.items()):
        for variant in ("off", "on"):
            c = v.get(variant, [])
            label = "--heap-retain 0" if variant == "off" else "default (kept)"
            out.append(f"{name:9} {ratio:4}%  {label:15}  {fmt([x['s'] for x in c]):11} "
                       f"{fmt([x['x_local'] for x in c]):12} {fmt([x['x_linux'] or 0.0 for x in c]):13} "
                       f"{fmt([x['zero_fill'] for x in c]):17} {fmt([x['remote'] for x in c]):14} "
                       f"{fmt([round(x['moved_mib']) for x in c]):10} {fmt([x['cpu_s'] for x in c])}")
        on, off = v.get("on", []), v.get("off", [])
        if on and off:
            out.append(f"{'':16}median x Linux swap: {statistics.median(x['x_linux'] or 0 for x in off):.2f}"
                       f" -> {statistics.median(x['x_linux'] or 0 for x in on):.2f}; x all-local: "
                       f"{statistics.median(x['x_local'] for x in off):.2f} -> "
                       f"{statistics.median(x['x_local'] for x in on):.2f}")
    text = "\n".join(out) + "\n"
    open(os.path.join(HERE, "summary.txt"), "w").write(text)
    print(text, end="")


if __name__ == "__main__":
    main()

"""sass_hotspots.py -- where a kernel's instructions and stalls go, from Nsight Compute's per-instruction table.

Reads the CSV that `ncu -i REPORT --page source --print-source sass --csv` prints for a report profiled with the
SourceCounters section (one row per SASS instruction: address, source text, warp instructions executed, warp
stall samples) and writes a Markdown summary: totals, executed instructions and stall samples per opcode, and the
instructions with the most stall samples. The point is to see what a kernel executes besides its matrix products
(HGMMA) and where its warps wait, before changing it.
  usage: python3 bench/kernels/sass_hotspots.py SASS.csv [--top N] [--title TEXT] > hotspots.md
"""
import argparse
import csv
import re
import sys
from collections import defaultdict

# Nsight Compute's column names for the two counters (they have varied between releases: matched by prefix).
EXECUTED = ("Instructions Executed", "inst_executed")
STALLS = ("Warp Stall Sampling (All Samples)", "Warp Stall Sampling (All Cycles)", "stall_sampling_all")


def find_column(header, names, what, path):
    for want in names:
        for i, h in enumerate(header):
            if h.strip().startswith(want) and "Thread" not in h:
                return i
    raise SystemExit(f"{path}: no column for {what} (looked for {', '.join(names)}); columns: {header}")


def number(text):
    text = text.strip().replace(",", "")
    return float(text) if text else 0.0


def opcode(source):
    """The instruction's opcode without its predicate and modifiers: '@!P0 BRA 0x10' -> 'BRA'."""
    words = source.strip().split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def read_rows(path):
    with open(path, newline="", errors="replace") as f:
        lines = [line for line in f if line.strip()]
    # ncu may print ==PROF== lines or a kernel banner before the table: the header is the first row that names
    # the source column.
    start = next((i for i, line in enumerate(lines) if re.search(r'"?Source"?\s*,', line)), None)
    if start is None:
        raise SystemExit(f"{path}: no per-instruction table (no header row with a Source column)")
    table = list(csv.reader(lines[start:]))
    header = table[0]
    src = header.index(next(h for h in header if h.strip() == "Source"))
    addr = next((i for i, h in enumerate(header) if h.strip() == "Address"), None)
    ex, st = find_column(header, EXECUTED, "instructions executed", path), find_column(header, STALLS, "stall samples", path)
    rows = []
    for r in table[1:]:
        if len(r) <= max(src, ex, st):
            continue
        rows.append({"addr": r[addr].strip() if addr is not None else "", "source": r[src].strip(),
                     "executed": number(r[ex]), "stalls": number(r[st])})
    if not rows:
        raise SystemExit(f"{path}: the per-instruction table has no rows")
    return rows


def summary(rows, top, title):
    total_ex = sum(r["executed"] for r in rows) or 1.0
    total_st = sum(r["stalls"] for r in rows) or 1.0
    per_op = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        p = per_op[opcode(r["source"])]
        p[0] += r["executed"]
        p[1] += r["stalls"]
        p[2] += 1
    out = [f"# {title}", "",
           f"{len(rows)} SASS instructions; {total_ex:,.0f} warp instructions executed; {total_st:,.0f} stall samples.",
           "", "| opcode | static | executed | share | stall samples | share |", "|---|---:|---:|---:|---:|---:|"]
    for op, (ex, st, n) in sorted(per_op.items(), key=lambda kv: -kv[1][0]):
        if ex == 0 and st == 0:
            continue
        out.append(f"| {op} | {n} | {ex:,.0f} | {100 * ex / total_ex:.1f}% | {st:,.0f} | {100 * st / total_st:.1f}% |")
    out += ["", f"The {top} instructions with the most stall samples:", "",
            "| address | instruction | executed | stall samples | share |", "|---|---|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: -r["stalls"])[:top]:
        text = r["source"].replace("|", "\\|")
        out.append(f"| {r['addr']} | `{text}` | {r['executed']:,.0f} | {r['stalls']:,.0f} | {100 * r['stalls'] / total_st:.1f}% |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    ap.add_argument("--top", type=int, default=40, help="how many of the most-stalled instructions to list")
    ap.add_argument("--title", default=None, help="the summary's heading (default: the CSV's name)")
    args = ap.parse_args(argv)
    sys.stdout.write(summary(read_rows(args.csv), args.top, args.title or args.csv))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes bench/results/README.md, the index of the run records, from each record's own README.md.

Every record is a folder here whose README.md opens with the lines `- Date:`, `- Commit:`, `- Machine:`,
`- Command:` and `- Measured:`; this script fails naming the record and the missing line, so the index can
only list what the records say. `--check` compares instead of writing (the CPU test runs it that way).
"""
import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIELDS = ("Date", "Commit", "Machine", "Command", "Measured")


def read_record(name):
    """The five fields of one record's README.md, or raises ValueError naming what is missing."""
    path = os.path.join(HERE, name, "README.md")
    if not os.path.isfile(path):
        raise ValueError(f"bench/results/{name}: no README.md")
    text = open(path, encoding="utf-8").read()
    fields = {}
    for field in FIELDS:
        m = re.search(rf"^- {field}: (.+)$", text, re.M)
        if not m:
            raise ValueError(f"bench/results/{name}/README.md: no '- {field}:' line")
        fields[field] = m.group(1).strip()
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", fields["Date"].split()[0]):
        raise ValueError(f"bench/results/{name}/README.md: Date '{fields['Date']}' is not YYYY-MM-DD")
    return fields


def records():
    return sorted(d for d in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, d)) and not d.startswith(("_", ".")))


def short(text, limit=220):
    text = text.replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3].rsplit(" ", 1)[0] + " ..."


def render():
    rows = []
    for name in records():
        f = read_record(name)
        rows.append((f["Date"].split()[0], name, f))
    rows.sort(key=lambda r: (r[0], r[1]), reverse=True)
    out = [
        "# Run records",
        "",
        "One folder per GPU run (or per set of measured tables), newest first. Each folder's README.md says the date,",
        "the commit measured, the machine, the exact command and what it measured; this index is made from those",
        "files by `python3 bench/results/index.py` (do not edit it by hand). The user-facing numbers are on",
        "[docs/results.md](../../docs/results.md), made from these records by `python3 bench/results/make_results.py`.",
        "",
        "| record | date | commit | machine | command | measured |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for date, name, f in rows:
        out.append(f"| [{name}]({name}/) | {date} | {short(f['Commit'], 80)} | {short(f['Machine'], 60)} | "
                   f"{short(f['Command'], 160)} | {short(f['Measured'])} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if README.md differs from what the records give")
    args = ap.parse_args()
    try:
        text = render()
    except ValueError as e:
        print(f"index.py: {e}", file=sys.stderr)
        return 1
    path = os.path.join(HERE, "README.md")
    if args.check:
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
        if old != text:
            print("index.py: bench/results/README.md is out of date; run python3 bench/results/index.py", file=sys.stderr)
            return 1
        print(f"index.py: {len(records())} records, index up to date")
        return 0
    open(path, "w", encoding="utf-8").write(text)
    print(f"index.py: wrote {path} ({len(records())} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

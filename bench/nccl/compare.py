"""compare.py -- joins the CSVs of torch_all_to_all.py (the anchor) and of one or more runs of
bench_all_to_all.cpp (labelled by their "impl" column) into one markdown table: time, algorithm
bandwidth and bus bandwidth of each, and each run's bus-bandwidth ratio to torch.

    python3 bench/nccl/compare.py torch.csv ours.csv [ours_blocking.csv ...] > table.md
"""
import csv
import sys


def load(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return (rows[0]["impl"] if rows else path), {int(r["bytes_per_rank"]): r for r in rows}


def human(n):
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


def cells(row):
    return f"{float(row['seconds']) * 1e6:.1f} | {float(row['algbw_GBps']):.1f} | {float(row['busbw_GBps']):.1f}"


def main():
    anchor_name, anchor = load(sys.argv[1])
    runs = [load(p) for p in sys.argv[2:]]
    header = f"| bytes per rank | {anchor_name} time (us) | algbw (GB/s) | busbw (GB/s) |"
    for name, _ in runs:
        header += f" {name} time (us) | algbw (GB/s) | busbw (GB/s) | {name} / {anchor_name} |"
    print(header)
    print("|" + " ---: |" * (4 + 4 * len(runs)))
    for size in sorted(anchor):
        line = f"| {human(size)} | {cells(anchor[size])} |"
        for _, rows in runs:
            if size in rows:
                ratio = float(rows[size]["busbw_GBps"]) / float(anchor[size]["busbw_GBps"])
                line += f" {cells(rows[size])} | {ratio:.3f} |"
            else:
                line += " - | - | - | - |"
        print(line)


if __name__ == "__main__":
    main()

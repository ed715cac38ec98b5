"""compare.py -- joins the CSVs of bench_all_to_all.cpp ("ours") and torch_all_to_all.py ("torch")
into a markdown table with the ratio ours/torch of bus bandwidth.

    python3 bench/nccl/compare.py ours.csv torch.csv > table.md
"""
import csv
import sys


def load(path):
    with open(path) as f:
        return {int(r["bytes_per_rank"]): r for r in csv.DictReader(f)}


def human(n):
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


def main():
    ours, torch = load(sys.argv[1]), load(sys.argv[2])
    print("| bytes per rank | ours time (us) | ours algbw (GB/s) | ours busbw (GB/s) | torch time (us) "
          "| torch algbw (GB/s) | torch busbw (GB/s) | ours / torch |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in sorted(set(ours) & set(torch)):
        o, t = ours[size], torch[size]
        ratio = float(o["busbw_GBps"]) / float(t["busbw_GBps"])
        print(f"| {human(size)} | {float(o['seconds']) * 1e6:.1f} | {float(o['algbw_GBps']):.1f} | "
              f"{float(o['busbw_GBps']):.1f} | {float(t['seconds']) * 1e6:.1f} | {float(t['algbw_GBps']):.1f} | "
              f"{float(t['busbw_GBps']):.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()

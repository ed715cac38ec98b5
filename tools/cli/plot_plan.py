#!/usr/bin/env python3
"""plot_plan.py -- draws what `cad plan --json` reports: the attention cost per server before
(colocated) and after each balancer on top, one bytes-per-link heat map per balancer below.

    cad plan ... --json > plan.json && python3 plot_plan.py plan.json --out plan.png
    cad plan ... --plot plan.png        (runs this script on the same JSON)

The output format follows OUT's extension (png, svg, pdf, ...; PNG for any other name). The file name is only ever handed to
matplotlib as a path: no shell or plotting language sees it. Exit status 3 when matplotlib is missing.
"""
import argparse
import json
import os
import sys


def load_pyplot():
    try:
        import matplotlib
    except ImportError:
        print("plot_plan.py: needs matplotlib for this python3 (%s): pip install matplotlib, or "
              "apt-get install python3-matplotlib" % sys.executable, file=sys.stderr)
        sys.exit(3)
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt
    return plt


def draw(plan, out):
    plt = load_pyplot()
    before = [c / 1e9 for c in plan["cost_before"]]
    ok = [b for b in plan["balancers"] if b.get("status") == "OK"]
    cols = max(1, len(ok))
    fig = plt.figure(figsize=(max(9, 4.2 * cols), 9))
    grid = fig.add_gridspec(2, cols)

    load = fig.add_subplot(grid[0, :])
    servers = range(len(before))
    load.plot(servers, before, marker="o", label="before (colocated)")
    for b in ok:
        if b["name"] != "colocated":  # the same as "before"
            load.plot(servers, [c / 1e9 for c in b["cost"]], marker="o", label=b["name"])
    load.set_title("attention cost per server (score entries / 1e9)")
    load.set_xlabel("server")
    if len(before) <= 32:
        load.set_xticks(list(servers))
    load.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))

    for i, b in enumerate(ok):
        ax = fig.add_subplot(grid[1, i])
        gib = [[x / 2**30 for x in row] for row in b["link_bytes"]]
        image = ax.imshow(gib, origin="lower", interpolation="nearest")
        fig.colorbar(image, ax=ax, label="GiB")
        ax.set_title("bytes per link: " + b["name"])
        ax.set_xlabel("destination")
        ax.set_ylabel("source")

    fig.tight_layout()
    # The file is written exactly as named: matplotlib would append ".png" to a name without a known
    # extension, so such a name gets PNG explicitly.
    extension = os.path.splitext(out)[1][1:].lower()
    fmt = extension if extension in fig.canvas.get_supported_filetypes() else "png"
    fig.savefig(out, format=fmt)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="?", help="`cad plan --json` output (default: standard input)")
    parser.add_argument("--out", required=True, help="the image to write (format from its extension)")
    args = parser.parse_args()
    if args.json is None:
        plan = json.load(sys.stdin)
    else:
        with open(args.json, encoding="utf-8") as f:
            plan = json.load(f)
    try:
        draw(plan, args.out)
    except (OSError, ValueError) as e:  # unwritable path, unknown extension
        print("plot_plan.py: cannot write %s: %s" % (args.out, e), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

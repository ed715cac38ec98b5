"""What the table scripts beside this file (network_table.py, long_docs_table.py, topology_scale_table.py) share:
their path options, one `cad simulate --json` run, and writing a table with the results it came from."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def add_path_options(parser, out_subdir):
    """--cad (default build/bin/cad), --dist ($CAD_DATA, else ../shared/data/doclen_pretrain.json) and --out
    (default docs/simulate/OUT_SUBDIR)."""
    parser.add_argument("--cad", default=os.path.join(ROOT, "build", "bin", "cad"))
    parser.add_argument("--dist", default=os.environ.get("CAD_DATA") or os.path.join(ROOT, "..", "shared", "data",
                                                                                   "doclen_pretrain.json"))
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "simulate", out_subdir))


def run(cad, args):
    """One `cad simulate ARGS --json --quiet`: the parsed result with the command that made it, or the script ends
    naming the command and its stderr."""
    cmd = [cad, "simulate"] + args + ["--json", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (done.returncode, " ".join(cmd), done.stderr))
    result = json.loads(done.stdout)
    result["command"] = " ".join(cmd)
    return result


def write(out, results_name, results, table_name, text):
    """OUT/RESULTS_NAME (the runs' JSON) and OUT/TABLE_NAME (the table made from them)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, results_name), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out, table_name), "w") as f:
        f.write(text)

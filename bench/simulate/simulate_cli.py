"""One `cad simulate --json` run for the table scripts beside this file (network_table.py, long_docs_table.py,
topology_scale_table.py): the parsed result with the command that made it, or the script ends naming the
command and its stderr."""
import json
import subprocess
import sys


def run(cad, args):
    cmd = [cad, "simulate"] + args + ["--json", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (done.returncode, " ".join(cmd), done.stderr))
    result = json.loads(done.stdout)
    result["command"] = " ".join(cmd)
    return result

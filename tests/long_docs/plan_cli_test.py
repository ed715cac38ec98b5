#!/usr/bin/env python3
"""`cad plan --max-doc-len/--tokens-per-rank` end to end: a 1M-token document over 8 ranks of 128K (scaled down
64x: 16384 tokens over 8 ranks of 2048) and a batch of documents spanning 1-5 ranks, with every balancer; what each
report says about balance, bytes and memory per server; the refusals of a memory cap and of bad command lines.

    plan_cli_test.py CAD PLUGIN_DIR DATA_DIR

Standard library only. Every check is an assert: any failure exits non-zero."""
import json
import subprocess
import sys

CAD, PLUGINS, DATA = sys.argv[1:4]
KV_TOKEN_BYTES = 2 * 8 * 128 * 2     # K and V, 8 KV heads, head_dim 128, 2 bytes: the defaults
Q_MEMORY_BYTES = 2 * 32 * 128 * 2    # Q and O rows of 32 heads
BALANCERS = ["colocated", "per_doc_cp", "distca", "prefix_aware"]


def cad_plan(*args):
    done = subprocess.run([CAD, "plan", "--path", PLUGINS, *args], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def report(*args):
    rc, out, err = cad_plan(*args, "--json", "--tasks")
    assert rc == 0, f"cad plan {args} exited {rc}: {err}"
    return json.loads(out)


def causal(q_begin, q_end):
    q = q_end - q_begin
    return q * q_end - q * (q - 1) // 2


def check_plan(rep, name):
    """Properties every plan must have: its tasks partition each document's queries, the server of a document's
    last query holds its whole prefix, and the memory reported is the plan model's."""
    b = next(x for x in rep["balancers"] if x["name"] == name)
    assert b["status"] == "OK", b
    doc_len = {}
    for rank in rep["pieces"]:
        for doc, length, offset, n in rank:
            doc_len[doc] = length
    covered = {d: [] for d in doc_len}
    for doc, q_begin, q_end, server in b["task_list"]:
        covered[doc].append((q_begin, q_end))
    last_server = {}
    for doc, q_begin, q_end, server in b["task_list"]:
        if q_end == doc_len[doc]:
            last_server[doc] = server
    for doc, ranges in covered.items():
        ranges.sort()
        at = 0
        for q_begin, q_end in ranges:
            assert q_begin == at, f"{name}: document {doc}'s queries not partitioned: {ranges}"
            at = q_end
        assert at == doc_len[doc], f"{name}: document {doc} covered to {at} of {doc_len[doc]}"
    longest = max(doc_len.values())
    assert b["max_kv_rows"] >= longest, f"{name}: no server holds the longest document's prefix ({b['max_kv_rows']})"
    for doc, server in last_server.items():
        assert b["kv_rows"][server] >= doc_len[doc], f"{name}: server {server} runs document {doc}'s last query"
    assert b["kv_bytes"] == [r * KV_TOKEN_BYTES for r in b["kv_rows"]]
    assert b["max_memory_received"] == max(b["memory_received"])
    assert sum(b["cost"]) == sum(rep["cost_before"]), f"{name}: the plan's work differs from the batch's"
    return b


# 1. One 1M-token document over 8 ranks of 128K, scaled down 64x.
rep = report("--lengths", f"{DATA}/one_million_scaled.json", "--tokens-per-rank", "2048", "--ranks", "8")
batch = rep["batch"]
assert (batch["documents"], batch["pieces"], batch["widest_span"], batch["longest"]) == (1, 8, 8, 16384), batch
assert rep["pieces"] == [[[0, 16384, r * 2048, 2048]] for r in range(8)], rep["pieces"]
assert rep["cost_before"] == [causal(r * 2048, (r + 1) * 2048) for r in range(8)]
assert [b["name"] for b in rep["balancers"]] == BALANCERS
plans = {name: check_plan(rep, name) for name in BALANCERS}
colocated = plans["colocated"]
# Colocated over pieces is the all-gather-KV CP: rank r holds (r + 1) pieces of K/V, r of them received.
assert colocated["kv_rows"] == [(r + 1) * 2048 for r in range(8)], colocated["kv_rows"]
assert colocated["memory_received"] == [r * 2048 * KV_TOKEN_BYTES for r in range(8)], colocated["memory_received"]
assert colocated["imbalance"] > 1.8, colocated["imbalance"]  # the last rank does ~15/8 of the mean
assert plans["per_doc_cp"]["imbalance"] < 1.01, plans["per_doc_cp"]["imbalance"]
assert plans["prefix_aware"]["imbalance"] <= 1.05, plans["prefix_aware"]["imbalance"]
assert plans["distca"]["imbalance"] < colocated["imbalance"]
floor = rep["memory_floor"]
assert (floor["doc_id"], floor["rank"], floor["bytes"]) == (0, 7, 14336 * KV_TOKEN_BYTES), floor

# 2. Documents spanning 1 to 5 ranks: the same properties, and the text table.
rep = report("--lengths", f"{DATA}/mixed_spans.json", "--tokens-per-rank", "2048", "--ranks", "8")
assert rep["batch"]["widest_span"] == 5 and rep["batch"]["documents"] == 5, rep["batch"]
for name in BALANCERS:
    check_plan(rep, name)
assert rep["balancers"][3]["imbalance"] <= 1.05, rep["balancers"][3]
rc, out, err = cad_plan("--lengths", f"{DATA}/mixed_spans.json", "--tokens-per-rank", "2048", "--ranks", "8")
assert rc == 0, err
assert "a document spans up to 5 ranks" in out, out
assert "max_kv_rows" in out and "max_recv_mem_GiB" in out, out
for name in BALANCERS:
    assert any(line.split()[:1] == [name] and len(line.split()) == 10 for line in out.splitlines()), (name, out)

# 3. A memory cap no plan fits: refused before planning, naming the document, the rank and the bytes.
need = 14336 * KV_TOKEN_BYTES
rc, out, err = cad_plan("--lengths", f"{DATA}/one_million_scaled.json", "--tokens-per-rank", "2048", "--ranks", "8",
                        "--memory-cap", str(need - 1))
assert rc == 1, (rc, out, err)
assert "document 0 (16384 tokens)" in err and "rank 7" in err and f"would receive {need} bytes" in err, err
assert out == "", out
# At the floor itself, prefix_aware plans within the cap and colocated just fits; per_doc_cp's head/tail layout puts
# the last chunk's whole prefix and its queries on rank 0, over the cap: the plugin refuses it, naming the server.
rc, out, err = cad_plan("--lengths", f"{DATA}/one_million_scaled.json", "--tokens-per-rank", "2048", "--ranks", "8",
                        "--memory-cap", str(need), "--json")
assert rc == 1, (rc, err)
rep = json.loads(out)
by_name = {b["name"]: b for b in rep["balancers"]}
assert by_name["prefix_aware"]["status"] == "OK" and "refused" not in by_name["prefix_aware"], by_name
assert by_name["prefix_aware"]["max_memory_received"] <= need
assert by_name["colocated"]["max_memory_received"] == need and "refused" not in by_name["colocated"]
assert by_name["per_doc_cp"]["status"] == "UNSUPPORTED" and "server 0" in by_name["per_doc_cp"]["error"], by_name
# Short tails: each rank's first piece continues a document, so colocated needs more than the least any plan
# needs (the rank holding most of a document could run its last query); under a cap between the two the layout is
# planned and every balancer's own check refuses what does not fit.
floor = report("--lengths", f"{DATA}/short_tails.json", "--tokens-per-rank", "2048", "--ranks", "8")["memory_floor"]
assert floor["bytes"] == (4100 - 2048) * KV_TOKEN_BYTES + Q_MEMORY_BYTES and floor["rank"] == 0, floor
rc, out, err = cad_plan("--lengths", f"{DATA}/short_tails.json", "--tokens-per-rank", "2048", "--ranks", "8",
                        "--memory-cap", str(floor["bytes"] + 1))
assert rc == 1 and "least memory any plan needs: document 0 (4100 tokens)" in out, (rc, out, err)
assert "colocated      error (UNSUPPORTED): plan: server 2 would receive 16777216 bytes" in out, out

# 4. Bad command lines and layouts: clear errors, naming what is wrong.
for args, code, text in [
    (["--dist", f"{DATA}/mixed_spans.json", "--tokens-per-rank", "2048", "--ranks", "8"], 2, "--max-doc-len is required"),
    (["--lengths", f"{DATA}/mixed_spans.json", "--max-doc-len", "4096", "--ranks", "8"], 2, "--tokens-per-rank is required"),
    (["--lengths", f"{DATA}/mixed_spans.json", "--tokens-per-rank", "2048", "--context", "2048", "--ranks", "8"], 2,
     "--context"),
    (["--lengths", f"{DATA}/mixed_spans.json", "--tokens-per-rank", "4096", "--ranks", "16"], 1, "cannot fill 16 ranks"),
    (["--lengths", f"{DATA}/mixed_spans.json", "--tokens-per-rank", "2048", "--ranks", "8", "--max-doc-len", "8000"], 1,
     "document 3 has 9000 tokens, above max_doc_len 8000"),
    (["--lengths", f"{DATA}/mixed_spans.json", "--tokens-per-rank", "2048", "--ranks", "8", "--plot", "x.png"], 2,
     "--plot is not taken"),
    # the cost options are read where every mode reads them: a window CAD refuses is refused here too
    (["--lengths", f"{DATA}/mixed_spans.json", "--tokens-per-rank", "2048", "--ranks", "8", "--window", "4",
      "--noncausal"], 1, "UNSUPPORTED: --window 4 with --noncausal"),
]:
    rc, out, err = cad_plan(*args)
    assert rc == code and text in err, (args, rc, err)

# 5. A sampled batch: DistCA's recipe scaled to the longest document, laid over the ranks whole.
rep = report("--dist", f"{DATA}/mixed_spans.json", "--max-doc-len", "16384", "--tokens-per-rank", "2048",
             "--ranks", "8", "--seed", "3")
assert rep["batch"]["sampled"] and rep["batch"]["longest"] <= 16384 and rep["batch"]["widest_span"] >= 2, rep["batch"]
for name in BALANCERS:
    check_plan(rep, name)
rc, out, err = cad_plan("--help")
assert rc == 0 and "--max-doc-len N" in out and "--tokens-per-rank T" in out, out
print("all cad plan long-document checks passed")

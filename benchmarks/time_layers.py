"""Time source trees on the one-stream sparse decode step (DeepSeek-V3.2 / GLM-5 at one
stream: 78 layers, each its own wrapper and index list, in one CUDA graph), for before/after
comparisons of a change in the same device session (GPU).

    python benchmarks/time_layers.py ROUNDS NAME=TREE [NAME=TREE ...]

Each tree (a checkout whose ``src`` holds fp8mla; ``main=.`` for this one) runs in its own
process, once a round, the trees' order reversed every other round. A tree's run checks one
layer's call against the float64 reference on the sparse bench's packed pool (plain lists,
lists with -1 entries, a ``topk_length`` and an empty row as ``time_revision.py`` checks them,
and an id outside the cache, which must give NaN), then times B1_H32_K2048 and B4_H32_K2048
as 78-layer graphs (µs a layer: the bench's ``LAYERS78_B1_H32_K2048`` for the first). Prints a
JSON line per run and a table last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def one(name: str) -> None:
    """This process's tree (``PYTHONPATH``): its checks and timings as one ``RESULT`` line."""
    import torch

    from fp8mla.bench import sparse_impls as S
    from fp8mla.bench.measure import time_graph
    from fp8mla.bench.sparse_cases import SPARSE_LAYERS, SparseCase
    from fp8mla.bench.sparse_impls import SM_SCALE, WORKSPACE_BYTES
    from fp8mla.bench.sparse_inputs import packed_pool, sparse_inputs
    from fp8mla.dsa.reference import sparse_mla_reference
    from fp8mla.dsa.sparse import SparseMLAWrapper
    from fp8mla.testing import rel_err
    from time_revision import edge_check

    dev = torch.device("cuda")
    pool = packed_pool(1 << 20, 64, dev)
    res: dict = {"tree": name}
    for batch in (1, 4):
        case = SparseCase(batch=batch, heads=32, topk=2048)
        inputs = [sparse_inputs(case, pool, seed=100 + i) for i in range(SPARSE_LAYERS)]
        ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        w = SparseMLAWrapper(ws, use_cuda_graph=True)
        w.plan(case.tokens, 32, 2048, 64, torch.bfloat16, SM_SCALE)
        inp = inputs[0]
        idx = inp.indices.clone()
        out, lse = w.run(inp.q_nope, inp.q_pe, pool, idx, return_lse=True)
        ro, rl = sparse_mla_reference(inp.q_nope, inp.q_pe, pool, idx, SM_SCALE)
        res[f"B{batch}_err"] = float(f"{rel_err(out, ro):.3g}")
        res[f"B{batch}_lse_err"] = float(f"{rel_err(lse, rl):.3g}")
        edges = edge_check(w, inp, pool, case.tokens)
        res[f"B{batch}_edge_err"] = edges["edge_rel_err"]
        res[f"B{batch}_empty_ok"] = edges["empty_row_ok"]
        idx3 = idx.clone()
        idx3[0, 5] = 1 << 21  # outside the pool
        out3 = w.run(inp.q_nope, inp.q_pe, pool, idx3)
        res[f"B{batch}_oob_nan"] = bool(torch.isnan(out3[0]).all())
        if batch > 1:
            res[f"B{batch}_oob_others_err"] = float(f"{rel_err(out3[1:], ro[1:]):.3g}")
        res[f"B{batch}_kernel"] = w.launch_plan.kernel
        del w
        runners = [S.fp8mla_sparse(x) for x in inputs]
        t = time_graph(lambda rs=runners: [r() for r in rs])
        res[f"B{batch}_us"] = round(t.us_median / SPARSE_LAYERS, 3)
        res[f"B{batch}_p20_p80"] = (
            round(t.us_p20 / SPARSE_LAYERS, 3),
            round(t.us_p80 / SPARSE_LAYERS, 3),
        )
        del runners
        torch.cuda.empty_cache()
    print("RESULT " + json.dumps(res), flush=True)


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "--one":
        one(sys.argv[2])
        return 0
    if len(sys.argv) < 3 or not sys.argv[1].isdigit() or any("=" not in a for a in sys.argv[2:]):
        raise SystemExit(__doc__.split("\n\n")[1])
    rounds, trees = int(sys.argv[1]), sys.argv[2:]
    rows = []
    for r in range(rounds):
        for spec in trees if r % 2 == 0 else trees[::-1]:
            name, path = spec.split("=", 1)
            env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(path), "src"))
            t0 = time.time()
            p = subprocess.run([sys.executable, __file__, "--one", name], env=env,
                               capture_output=True, text=True)  # fmt: skip
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            if not line:
                print(f"{name} round {r} FAILED rc={p.returncode}\n{p.stderr[-3000:]}", flush=True)
                continue
            d = json.loads(line[0][len("RESULT ") :])
            d.update(round=r, secs=round(time.time() - t0, 1))
            rows.append(d)
            print(json.dumps(d), flush=True)
    print(
        "\n| tree | round | B1 µs/layer | B4 µs/layer | B1 err | B4 err | -1 entries, empty row | outside the pool |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for d in rows:
        print(
            f"| {d['tree']} | {d['round']} | {d['B1_us']} | {d['B4_us']} | {d['B1_err']} | "
            f"{d['B4_err']} | {d['B1_edge_err']}/{d['B4_edge_err']} {d['B4_empty_ok']} | "
            f"{d['B1_oob_nan']}/{d['B4_oob_nan']} {d.get('B4_oob_others_err')} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: TGRL token JS divergence over a realistic vocabulary (issue 3 acceptance).

Measures ``agent_rl.algos.js_divergence_from_logits`` for N = 8192 rows x V = 151936 (Qwen2.5 vocabulary):

1. Peak extra memory per call, for several ``chunk_size`` values: each measurement runs in a fresh subprocess that
   allocates a (rows, V) float32 logits block, records the peak RSS (``resource.getrusage().ru_maxrss``, the kernel's
   high-water mark), calls the function and records the peak again; the difference is the extra memory the call
   needed. It should scale with ``chunk_size`` (at most 5 float32 (chunk, V) buffers), not with the rows.
2. Time for all N rows with the chosen chunk size. N x V float32 is 5 GB, so the logits are generated block by block
   (``--block`` rows at a time, never all at once); only the JS calls are timed (the result is row-independent, so
   this is the same work as one call on the whole tensor).
3. A policy forward pass of the same rows for comparison: the lm_head matmul (N, d) x (d, V) plus a stack of
   ``--layers`` transformer layers (``torch.nn.TransformerEncoderLayer``, d_model d, Qwen2.5-like FFN width), timed
   on ``--sample-rows`` rows (one sequence) and extrapolated linearly to N rows. Defaults: Qwen2.5-0.5B shape
   (d = 896, 24 layers, 14 heads, FFN 4864). This underestimates a real forward (no embedding, GQA/rotary, etc.),
   so the reported ratio JS / forward is pessimistic for JS.
4. Optional (``--compile``): ``compile=True`` (each chunk through ``torch.compile(js_divergence_rows)``) on one
   block, against the eager path on the same block.

Single-threaded by default (``--threads 1``) because the dev machine is shared; the ratio is what matters.
Run:  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_js.py [--compile]   (about 2-3 min on an idle core;\n      --compile adds about 1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

MIB = 1024 * 1024


def _rss_peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _memory_child(rows: int, vocab: int, chunk: int | None) -> None:
    """Runs in a subprocess: prints JSON with the peak extra bytes of one JS call."""
    from agent_rl.algos import js_divergence_from_logits

    torch.set_num_threads(1)
    warm = torch.randn(4, 64)
    js_divergence_from_logits(warm, 0.3, 1.2)  # import / first-call overheads outside the measurement
    logits = torch.empty(rows, vocab).normal_(0.0, 3.0)  # writes every page: counted in the baseline
    before = _rss_peak_bytes()
    js_divergence_from_logits(logits, 0.3, 1.2, chunk_size=chunk)
    after = _rss_peak_bytes()
    print(json.dumps({"rows": rows, "chunk": chunk, "extra_bytes": after - before,
                      "input_bytes": logits.numel() * 4}))


def measure_memory(rows: int, vocab: int, chunks: list[int | None]) -> list[dict]:
    out = []
    for c in chunks:
        cmd = [sys.executable, __file__, "--_child", str(rows), str(vocab), str(c if c is not None else 0)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        out.append(json.loads(res.stdout.strip().splitlines()[-1]))
    return out


def time_js(n: int, vocab: int, block: int, chunk: int) -> tuple[float, float]:
    """Seconds for JS over n rows (generated block by block), and the mean J (sanity)."""
    from agent_rl.algos import js_divergence_from_logits

    total, acc, done = 0.0, 0.0, 0
    buf = torch.empty(block, vocab)
    while done < n:
        rows = min(block, n - done)
        x = buf[:rows].normal_(0.0, 3.0)
        t0 = time.perf_counter()
        j = js_divergence_from_logits(x, 0.3, 1.2, chunk_size=chunk)
        total += time.perf_counter() - t0
        acc += float(j.sum())
        done += rows
    return total, acc / n


def time_forward(rows: int, d: int, layers: int, heads: int, ffn: int, vocab: int) -> tuple[float, float]:
    """Seconds for (lm_head, layer stack) on one sequence of ``rows`` tokens (no grad, float32)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, batch_first=True, norm_first=True)
    layer.eval()
    lm_head = torch.nn.Linear(d, vocab, bias=False)
    h = torch.randn(1, rows, d)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(rows)
    with torch.no_grad():
        layer(h, src_mask=causal, is_causal=True)  # warm-up
        t0 = time.perf_counter()
        reps = 2
        for _ in range(reps):
            layer(h, src_mask=causal, is_causal=True)
        t_layer = (time.perf_counter() - t0) / reps
        lm_head(h[0, :16])
        t0 = time.perf_counter()
        lm_head(h[0])
        t_head = time.perf_counter() - t0
    return t_head, t_layer * layers


def time_compiled(rows: int, vocab: int, chunk: int) -> tuple[float, float, float] | None:
    """(compile + first call s, eager s, compiled s) for one (rows, V) block with ``compile=True`` (each chunk through
    ``torch.compile(js_divergence_rows)``), or None if torch.compile fails here."""
    from agent_rl.algos import js_divergence_from_logits

    x = torch.empty(rows, vocab).normal_(0.0, 3.0)
    try:
        t0 = time.perf_counter()
        js_divergence_from_logits(x[:chunk], 0.3, 1.2, chunk_size=chunk, compile=True)  # compiles
        t_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        y_c = js_divergence_from_logits(x, 0.3, 1.2, chunk_size=chunk, compile=True)
        t_comp = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - optional path; report and go on
        print(f"torch.compile failed: {type(e).__name__}: {str(e)[:200]}")
        return None
    t0 = time.perf_counter()
    y_e = js_divergence_from_logits(x, 0.3, 1.2, chunk_size=chunk)
    t_eager = time.perf_counter() - t0
    print(f"   compiled vs eager max abs diff: {float((y_c - y_e).abs().max()):.2e}")
    return t_first, t_eager, t_comp


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=8192, help="rows (tokens) N")
    p.add_argument("--vocab", type=int, default=151936, help="vocabulary V (Qwen2.5)")
    p.add_argument("--chunk", type=int, default=32, help="chunk_size for the timing run")
    p.add_argument("--block", type=int, default=1024, help="rows of logits generated at a time for the timing run")
    p.add_argument("--mem", type=str, default="512:16,512:64,512:256,512:0,128:64,2048:64",
                   help="rows:chunk_size pairs for the memory measurement (chunk 0 = None)")
    p.add_argument("--d", type=int, default=896, help="hidden size (0.5B: 896, 1.5B: 1536)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--ffn", type=int, default=4864)
    p.add_argument("--sample-rows", type=int, default=256, help="rows of the timed forward sample")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="also time torch.compile on one block")
    p.add_argument("--_child", nargs=3, type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a._child:
        rows, vocab, c = a._child
        _memory_child(rows, vocab, c or None)
        return
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, N={a.n}, V={a.vocab}")

    print("\n1. Peak extra memory of one call on a (rows, V) float32 block, one fresh process per line:")
    print(f"{'rows':>5} | {'input MiB':>9} | {'chunk_size':>10} | {'(chunk,V) f32 MiB':>17} | {'peak extra MiB':>14} | "
          f"{'/ chunk buf':>11}")
    for pair in a.mem.split(","):
        rows, c = (int(v) for v in pair.split(":"))
        r = measure_memory(rows, a.vocab, [c or None])[0]
        buf = (c or rows) * a.vocab * 4 / MIB
        ex = r["extra_bytes"] / MIB
        print(f"{rows:5d} | {r['input_bytes'] / MIB:9.0f} | {str(r['chunk']):>10} | {buf:17.1f} | {ex:14.1f} | "
              f"{ex / buf:11.1f}")

    print(f"\n2. JS over all N = {a.n} rows, chunk_size={a.chunk}, logits generated {a.block} rows at a time:")
    t_js, j_mean = time_js(a.n, a.vocab, a.block, a.chunk)
    print(f"   time {t_js:.2f} s ({t_js / a.n * 1e3:.3f} ms/row), mean J {j_mean:.4f}")

    print(f"\n3. Policy forward of the same rows, d={a.d}, {a.layers} layers, FFN {a.ffn}, timed on "
          f"{a.sample_rows} rows and scaled x{a.n / a.sample_rows:.0f}:")
    t_head, t_stack = time_forward(a.sample_rows, a.d, a.layers, a.heads, a.ffn, a.vocab)
    scale = a.n / a.sample_rows
    t_fwd = (t_head + t_stack) * scale
    print(f"   lm_head {t_head * scale:.2f} s + layers {t_stack * scale:.2f} s = {t_fwd:.2f} s")
    print(f"\n{'what':<34} | {'seconds':>8}")
    print(f"{'JS (N rows, chunked)':<34} | {t_js:8.2f}")
    print(f"{'lm_head only (N rows)':<34} | {t_head * scale:8.2f}")
    print(f"{'forward: lm_head + layers (N rows)':<34} | {t_fwd:8.2f}")
    print(f"ratio JS / forward = {t_js / t_fwd:.3f};  JS / lm_head alone = {t_js / (t_head * scale):.3f}")

    if a.compile:
        print(f"\n4. torch.compile on one ({a.block}, {a.vocab}) block, chunk_size={a.chunk}:")
        res = time_compiled(a.block, a.vocab, a.chunk)
        if res:
            t_first, t_eager, t_comp = res
            print(f"   compile + first chunk {t_first:.1f} s; {a.block} rows: eager {t_eager:.2f} s, compiled "
                  f"{t_comp:.2f} s (x{t_eager / t_comp:.2f})")


if __name__ == "__main__":
    main()

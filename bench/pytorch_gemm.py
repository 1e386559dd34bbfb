"""PyTorch's GEMMs on the shapes of bench/gemm.cpp (loom_bench_gemm), for a side-by-side run.

Why: the issue asks for a current oneDNN against Debian's 2.6 per CPU. PyTorch 2.x wheels carry a
current oneDNN (torch.__config__.show() names it) and run bf16 torch.mm through it on CPUs with bf16
instructions; f32 torch.mm goes to MKL instead. So this measures "a current oneDNN" for bf16 without
porting loom to the v3 API (docs/gemm.md says what it found).

Legend and shapes as bench/gemm.cpp: T = 2048 tokens; for each linear layer x[T, in] -> y[T, out] with
w[out, in]: forward y = x w^T, backward dx = dy w, dW = dy^T x; then a 2048^3 square. Differences from
loom's bench: torch.mm's bf16 product is written in bf16 (loom's in f32: twice the bytes for C), and
each shape is timed as the median of ROUNDS batches of calls (loom's: Google Benchmark's iterations).

  /tmp/torch2venv/bin/python bench/pytorch_gemm.py [--threads 2] [--rounds 5]
"""
import argparse
import time

import torch


def problems():
    t = 2048
    out = []
    for fan_in, fan_out in ((512, 512), (512, 1344), (1344, 512), (512, 10000)):
        out.append((f"{fan_in}x{fan_out} fwd  y=x*W^T", False, True, t, fan_out, fan_in))
        out.append((f"{fan_in}x{fan_out} bwd dx=dy*W", False, False, t, fan_in, fan_out))
        out.append((f"{fan_in}x{fan_out} bwd dW=dy^T*x", True, False, fan_out, fan_in, t))
    out.append(("square", False, False, 2048, 2048, 2048))
    return out


def gflops(ta, tb, m, n, k, dtype, rounds):
    a = torch.randn((k, m) if ta else (m, k)).to(dtype)
    b = torch.randn((n, k) if tb else (k, n)).to(dtype)
    lhs, rhs = (a.t() if ta else a), (b.t() if tb else b)
    for _ in range(3):
        torch.mm(lhs, rhs)
    flops = 2.0 * m * n * k
    calls = max(3, int(2e10 / flops))  # about 0.1 s a batch at 200 GFLOP/s
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            torch.mm(lhs, rhs)
        times.append((time.perf_counter() - start) / calls)
    times.sort()
    return flops / times[len(times) // 2] / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.threads < 1 or args.rounds < 1:
        parser.error(f"--threads and --rounds must be >= 1, got {args.threads} and {args.rounds}")
    torch.set_num_threads(args.threads)
    dnn = [line.strip() for line in torch.__config__.show().splitlines() if "DNN" in line]
    print(f"# torch {torch.__version__}, {args.threads} threads; {dnn[0] if dnn else 'no oneDNN'}")
    print("| GEMM | M | N | K | torch f32 GFLOP/s | torch bf16 GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for name, ta, tb, m, n, k in problems():
        f32 = gflops(ta, tb, m, n, k, torch.float32, args.rounds)
        b16 = gflops(ta, tb, m, n, k, torch.bfloat16, args.rounds)
        print(f"| {name} | {m} | {n} | {k} | {f32:.1f} | {b16:.1f} |", flush=True)


if __name__ == "__main__":
    main()

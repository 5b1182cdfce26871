"""The matmul's menu: which tile plans to try for a problem, best guess first, and how to read
one. A plan says how to compute one problem: the tile (BM, BN, BK), GROUP_M, num_warps,
num_stages, the number of K splits, whether to stage a or b K-major first (TF32 only), and for
large problems a TMA or persistent form, or hopper.py's Gluon kernel. The tuner
(kernels/tuning.py) times these candidates or takes the shipped table's choice; the launchers
are in matmul.py.
"""
from __future__ import annotations

import torch

from . import hopper
from .launch import cdiv, next_power_of_2


# Large problems: (BM, BN, BK, warps, stages), best guess first. 16-bit and TF32 tiles need
# 128x128 or more to feed wgmma; the fp32 FMA path is register-bound and likes 64-128 wide tiles.
_LARGE_TILES = {
    "half": [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4),
             (128, 128, 64, 4, 4), (128, 128, 32, 4, 4), (128, 64, 64, 4, 4),
             (64, 128, 64, 4, 4)],
    "tf32": [(128, 256, 32, 8, 3), (128, 128, 32, 8, 4), (256, 128, 32, 8, 3),
             (128, 128, 32, 4, 4), (128, 128, 64, 8, 3), (128, 64, 32, 4, 4),
             (64, 128, 32, 4, 4)],
    "ieee": [(128, 128, 32, 4, 4), (64, 256, 32, 4, 4), (128, 128, 32, 8, 3),
             (128, 256, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
             (128, 128, 16, 8, 4)],
    "fp64": [(32, 32, 8, 4, 2), (64, 32, 8, 4, 2)],
}
_SMALL_BK = {"half": 64, "tf32": 32, "ieee": 32, "fp64": 8}
# Problems too small to fill the GPU with 128x128 tiles (the MNIST layers): small tiles, many
# programs, most with split-K. Order and sizes from benchmarks/sweep_matmul.py on an H200,
# where 16x32 and 32x64 tiles beat 64x64 by 1.3-2x on every fp32 MNIST product.
_SMALL_TILES = [(16, 32), (32, 64), (64, 32), (16, 64), (32, 32), (64, 64), (64, 128),
                (128, 64)]
# Problems whose output does not fill the GPU with 128x128 tiles but whose K is long: the weight
# gradients dW = dY^T @ X of a layer over many rows (the gpt recipe's [1152, 16384] @ [16384,
# 384]: 27 output tiles, K = 16384) and narrow heads ([16384, 384] @ [384, 84]). The small tiles
# above run such a product on CUDA cores in effect (a 16x32 tile is below wgmma's 64-row
# minimum) and took 0.3-0.8 ms each for the recipe's bf16 products on an H200 (its eager step:
# 32 of 40 ms in _matmul_kernel, benchmarks/profile_gpt.py, 2026-12-02); tensor-core tiles with
# split-K over the long axis come first from MEDIUM_MACS multiply-adds on (the MNIST products
# stay below it: the largest, cnn fc1, is 100 x 512 x 3136 = 1.6e8), for exact fp32 after the
# small tiles (see candidate_plans).
_MEDIUM_TILES = {
    "half": [(128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4)],
    "tf32": [(128, 128, 32, 8, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4)],
    "ieee": [(128, 128, 32, 4, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4)],
}
MEDIUM_MACS = 2 ** 28
# Exact fp32 may also run as 3xTF32 (input_precision "tf32x3": each operand split into a TF32
# head and a TF32 tail, three tensor-core products, the tail x tail term dropped). Its error
# stays at fp32 level: relative 4e-8 to 3e-7 of |a| @ |b| on the MNIST products, against 1e-7 to
# 3e-7 for the FMA path (benchmarks/sweep_matmul.py --x3). It was 1.05-1.6x faster on the
# small ones; the tuner tries it on these tiles, 128x64 with 8 warps (the MNIST cnn's fc1
# forward, 100x3136 @ 3136x512, on an H200 in CUDA graphs: 12.7 us at 128x64 w8 split 16
# against 14.3 for the plan of the first four tiles that the table had, 64x32 w4 split 8).
_SMALL_X3_TILES = {(16, 32), (32, 64), (64, 32), (16, 64), (128, 64)}

# TMA plans (_matmul_tma_kernel): (BM, BN, BK, warps, stages, persistent), best first, for
# large problems whose operands TMA can read (_tma_operands). From benchmarks/sweep_tma.py on an
# H100 (Triton 3.6, 2026-11-24; ratio = cuBLAS time / ours, kernel time):
# - fp16/bf16: 128x256x64 w8 s3 persistent. 4096^3 a @ b 0.95-0.96 (the classic kernel the
#   same, 0.96-0.97), x @ w.t() 0.98-1.02 (classic 0.82-0.86); 8192^3 a @ b with automatic
#   warp specialization 0.94-1.02 (without 0.89-0.94, classic 0.87-0.94; with it at 4096: 0.89-
#   0.91). 4 stages of 128x256 tiles do not fit in shared memory; 128x128 tiles reach 0.86-0.89.
# - TF32: 128x128x32 w8 s4 persistent: x @ w.t() at 4096^3 0.95 (classic 0.89). 128x256 fp32
#   tiles do not fit (the epilogue's tile takes 128 kB). wgmma reads TF32 K-major only: an
#   N-major b (a @ b) made Triton copy each tile through registers (0.17-0.2x), and staged
#   K-major first (one copy pass) 0.69 / 0.78 at 4096 / 8192 against the classic staged plan's
#   0.75 / 0.87, which stays first there.
_TMA_TILES = {
    "half": [(128, 256, 64, 8, 3, True), (128, 256, 64, 8, 3, False), (256, 128, 64, 8, 3, True)],
    "tf32": [(128, 128, 32, 8, 4, True), (128, 128, 32, 4, 4, True), (64, 256, 32, 4, 4, True),
             (128, 128, 32, 8, 4, False)],
}
# A TMA plan's problem must have at least this many multiply-adds (smaller ones keep the
# classic menu: the MNIST products, and anything the sweep did not measure); from TMA_WS_MACS
# on (8192^3 measured, 4096^3 not), fp16/bf16 put the warp-specialized plan first.
TMA_MIN_MACS = 2 ** 35  # 4096 x 4096 x 2048
TMA_WS_MACS = 2 ** 38
# From TMA_TRY_MACS on (below TMA_MIN_MACS) TMA plans follow the classic ones on the menu, so
# that the tuner and the shipped table may take them where they win; the first guess stays
# classic. The gpt recipe's forward products (2^31-2^33) ran at 0.71-0.77 of cuBLAS on classic
# plans (bench matmul --sections gpt, H200, 2026-12-02), where the TMA kernel reached 0.98-1.02
# against the classic 0.82-0.86 on x @ w.t() at 4096^3.
TMA_TRY_MACS = 2 ** 30


def _kind(dtype, precision) -> str:
    """The compute path of a dtype at the call's precision ("high" or "highest"): half
    (fp16/bf16), tf32, ieee (exact fp32) or fp64."""
    if dtype == torch.float32:
        return "tf32" if precision == "high" else "ieee"
    return "fp64" if dtype == torch.float64 else "half"


def _plan(BM, BN, BK, warps, stages, split=1, stage_a=False, stage_b=False, x3=False):
    return dict(BM=BM, BN=BN, BK=BK, GM=8, warps=warps, stages=stages, split=split,
                stage_a=stage_a, stage_b=stage_b, x3=x3)


def _tma_plan(BM, BN, BK, warps, stages, persistent, stage_a=False, stage_b=False, ws=False):
    """A plan of _matmul_tma_kernel (ws: automatic warp specialization of the tile loop).
    NOTE: only TMA plans carry the "tma", "persistent" and "ws" fields, so that the classic
    plans compare equal to those of tuning caches and shipped tables made before TMA plans."""
    return {**_plan(BM, BN, BK, warps, stages, stage_a=stage_a, stage_b=stage_b), "tma": True,
            "persistent": persistent, "ws": ws}


def _rs_plan():
    """The plan of hopper._tf32_nmajor_kernel (TF32 a @ b with an N-major b, b's tiles as
    wgmma's register operand): its BM x BN is the output tile in m x n."""
    return {**_plan(hopper.TILE_M, hopper.TILE_N, hopper.TILE_K, hopper.WARPS, hopper.STAGES),
            "tma": True, "persistent": False, "ws": False, "rs": True}


def split_k_heuristic(batch, M, N, K, BM, BN, BK, sms):
    """How many K slices to give each output tile: enough programs to fill `sms` SMs once,
    each slice at least two BLOCK_K steps long, at most 16 slices (the reduction reads them
    all). 1 when the output tiles alone fill the GPU or K is short."""
    tiles = batch * cdiv(M, BM) * cdiv(N, BN)
    k_tiles = cdiv(K, BK)
    if tiles * 2 > sms or k_tiles < 4:
        return 1
    return max(1, min(sms // tiles, k_tiles // 2, 16))


def candidate_plans(batch, M, N, K, kind, a_kmajor, b_kmajor, sms, tma=False, rs=False):
    """The plans the tuner times for one problem, best guess first.

    Large problems (the 128x128 tiles fill the SMs) try the large-tile menu of their kind.
    Smaller ones try the small tiles (_SMALL_TILES) that fit the matrix, each with the split
    of split_k_heuristic and without. TF32 adds K-major staged variants of the first plans
    when an operand's K stride is not 1. `tma`: TMA can read the operands (_tma_operands); large
    fp16/bf16/TF32 problems then also try TMA plans, first where tma_first() says so; TF32 ones
    staged K-major where an operand is not. `rs`: the GPU runs hopper.py's kernel; a TF32 TMA
    problem with a K-major a and an N-major b then tries it first (rs is only given where
    the problem is one for TMA plans first, tma_problem at TMA_MIN_MACS).
    """
    if kind == "fp64":
        return [_plan(*t) for t in _LARGE_TILES["fp64"]]
    large = batch * cdiv(M, 128) * cdiv(N, 128) >= sms
    plans = []
    staged = {"stage_a": not a_kmajor, "stage_b": not b_kmajor}
    if large:
        plans = [_plan(*t) for t in _LARGE_TILES[kind]]
        if kind == "ieee":
            # 3xTF32 on tensor cores first, K-major staged where that is needed: the plans tuned
            # at 1024^3 and 4096^3 on an H100 are (1.47x cuBLAS's IEEE at 4096^3), where the
            # FMA tiles' best reached ~0.8x (bench matmul at 2048^3 and 8192^3, 2026-11-24)
            x3 = [_plan(*t, x3=True) for t in ((128, 128, 32, 8, 4), (128, 256, 32, 8, 3))]
            staged_x3 = [{**p, **staged} for p in x3] if not (a_kmajor and b_kmajor) else []
            plans = staged_x3 + x3 + plans
    else:
        medium = _medium_plans(batch, M, N, K, kind, sms) if batch * M * N * K >= MEDIUM_MACS \
            else []
        tiles = [(bm, bn) for bm, bn in _SMALL_TILES
                 if bm <= max(16, next_power_of_2(M)) and bn <= max(32, next_power_of_2(N))]
        for bm, bn in tiles:
            small = bm * bn <= 2048
            # NOTE: exact fp32 (FMA) tiles of 2048 outputs or fewer hold their K slice in
            # registers: BLOCK_K 16 keeps them there (32 spills on the MNIST shapes)
            bk = 16 if (kind == "ieee" and small) else _SMALL_BK[kind]
            bk = min(bk, max(16, next_power_of_2(K)))
            bases = [_plan(bm, bn, bk, 2 if small else 4, 3)]
            if kind == "ieee" and (bm, bn) in _SMALL_X3_TILES:
                bk = min(32, max(16, next_power_of_2(K)))
                warps = 8 if bm * bn >= 8192 else 4 if bm * bn >= 2048 else 2
                bases.append(_plan(bm, bn, bk, warps, 3, x3=True))
            for base in bases:
                split = split_k_heuristic(batch, M, N, K, bm, bn, base["BK"], sms)
                splits = [split, 1]
                if base["x3"] and split > 1:
                    # latency-bound 3xTF32 tiles want more programs than SMs: twice the
                    # heuristic's slices too, each still two K steps or more (MNIST cnn fc1's
                    # forward on an H200, CUDA graphs: 16.8 us at 32x64 split 4, 14.7 at 64x32
                    # split 8, the cnn step 219.9 -> 217.8 us)
                    if cdiv(K, base["BK"]) >= 4 * split:
                        splits.append(2 * split)
                for s in dict.fromkeys(splits):
                    plans.append({**base, "split": s})
        # exact fp32 keeps its small 3xTF32 tiles first: tuned on an H200 (2026-12-02), the
        # gpt recipe's fp32 dW [1152, 16384] @ [16384, 384] took 16x64 3xTF32 over every
        # medium tile
        plans = plans + medium if kind == "ieee" else medium + plans
    if kind == "tf32" and not (a_kmajor and b_kmajor):
        staged_plans = [{**p, **staged} for p in plans[:3]]
        # large: staged first (benchmarks/sweep_tma.py, H100, a @ b: 0.75 / 0.87 of cuBLAS at
        # 4096 / 8192 against 0.22 / 0.24 with wgmma reading an N-major TF32 b)
        plans = staged_plans + plans if large else plans + staged_plans
    if tma and tma_problem(batch, M, N, K, kind, sms, TMA_TRY_MACS):
        tiles = _TMA_TILES[kind]
        if kind == "tf32":  # wgmma reads TF32 K-major only
            tma_plans = [_tma_plan(*t, **staged) for t in tiles]
            if not (a_kmajor and b_kmajor):  # staged: best without the persistent loop
                tma_plans = tma_plans[-1:] + tma_plans[:-1]
        else:
            tma_plans = [_tma_plan(*t) for t in tiles]
            if batch * M * N * K >= TMA_WS_MACS:
                tma_plans.insert(0, _tma_plan(*tiles[0], ws=True))
        first = tma_problem(batch, M, N, K, kind, sms) and \
            tma_first(batch, M, N, K, kind, a_kmajor, b_kmajor)
        plans = tma_plans + plans if first else plans + tma_plans
        if rs and rs_problem(kind, a_kmajor, b_kmajor):
            # H200, 2026-11-25: 0.83-0.93 of cuBLAS at 4096^3, 0.88-0.94 at 8192^3, against
            # 0.71-0.85 for the staged plans (bench matmul and scratch kernels, Triton 3.6)
            plans.insert(0, _rs_plan())
    return plans


def _medium_plans(batch, M, N, K, kind, sms):
    """Tensor-core tiles for a product too narrow to fill the GPU but with MEDIUM_MACS or more
    multiply-adds: each tile with split_k_heuristic's slices (and without, if that differs),
    the tile that wastes least of the output first; 3xTF32 for exact fp32."""
    def waste(tile):
        bm, bn = tile[:2]
        return cdiv(M, bm) * bm * cdiv(N, bn) * bn / (M * N)

    plans = []
    for t in sorted(_MEDIUM_TILES[kind], key=waste):
        base = _plan(*t, x3=kind == "ieee")
        split = split_k_heuristic(batch, M, N, K, t[0], t[1], t[2], sms)
        plans += [{**base, "split": s} for s in dict.fromkeys((split, 1))]
    return plans


def rs_problem(kind, a_kmajor, b_kmajor):
    """Whether a TMA problem is one for hopper.py's kernel: TF32, a K-major, b N-major."""
    return kind == "tf32" and a_kmajor and not b_kmajor


def tma_first(batch, M, N, K, kind, a_kmajor, b_kmajor):
    """Whether a TMA problem's best guess is a TMA plan (where the sweep measured it to win,
    see _TMA_TILES): a K-major a and either a K-major b (x @ w.t()) or, for fp16/bf16,
    TMA_WS_MACS multiply-adds (with warp specialization)."""
    return a_kmajor and (b_kmajor or (kind == "half" and batch * M * N * K >= TMA_WS_MACS))


def tma_problem(batch, M, N, K, kind, sms, minimum=TMA_MIN_MACS):
    """Whether a problem is one for TMA plans: fp16/bf16 or TF32, large enough to fill the GPU
    with 128x128 tiles and to have `minimum` multiply-adds (TMA_MIN_MACS: where TMA plans may
    be the first guess; TMA_TRY_MACS: where the menu offers them)."""
    return kind in _TMA_TILES and batch * cdiv(M, 128) * cdiv(N, 128) >= sms and \
        batch * M * N * K >= minimum


# ============================================================================== tuning
# Plans come from kernels/tuning.py: this machine's cache, the shipped table, timing (opt-in),
# or candidate_plans(...)[0].


def describe(plan) -> str:
    """A plan in a few words: '128x256x64 w8 s3', then 'split 4', 'stage a', 'stage b',
    '3xtf32', 'tma', 'persistent'."""
    words = [f"{plan['BM']}x{plan['BN']}x{plan['BK']} w{plan['warps']} s{plan['stages']}"]
    if plan["split"] > 1:
        words.append(f"split {plan['split']}")
    words += [f"stage {x}" for x in "ab" if plan[f"stage_{x}"]]
    if plan.get("x3"):
        words.append("3xtf32")
    if plan.get("tma"):
        words.append("tma" + ", persistent" * bool(plan.get("persistent"))
                     + ", warp-specialized" * bool(plan.get("ws"))
                     + ", b in registers (gluon)" * bool(plan.get("rs")))
    return ", ".join(words)

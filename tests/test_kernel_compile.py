"""The project's newest Triton kernels compile for SM90 without a GPU.

Triton's interpreter runs a kernel's Python, not its compiler: a kernel can pass
every interpreted test and still be refused by the compiler (an ``if`` whose
branches give one name two types did, on the H200). Compiling to a cubin for
compute capability 9.0 needs no device, only Triton and its bundled ptxas, so it
runs here, in a fresh interpreter where ``TRITON_INTERPRET`` is unset."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ignition.components.linear import _rows_gated_kernel, _rows_linear_kernel
from ignition.components.triton_kv_write import _rope_write_kv_kernel

def defaults(fn, constexprs):
    # A launch takes a constexpr's default where it is not given; ASTSource does not.
    given = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    return {**given, **constexprs}

def compile(fn, types, constexprs, **options):
    names = fn.arg_names
    signature = dict(zip(names, types + ["constexpr"] * (len(names) - len(types))))
    return triton.compile(ASTSource(fn, signature, constexprs=defaults(fn, constexprs)),
                          target=GPUTarget("cuda", 90, 32), options=options)

ROPE = ["*bf16"] * 5 + ["*i64"] + ["*bf16"] * 3 + ["fp32"] + ["i32"] * 3
for has_norm in (True, False):
    for block_t, warps in ((1, 1), (16, 4)):
        k = compile(_rope_write_kv_kernel, ROPE,
                    dict(HEADS=32, KV_HEADS=8, HEAD_DIM=128, BLOCK=64, BLOCK_T=block_t,
                         PAGE_SIZE=64, HAS_NORM=has_norm), num_warps=warps)
        # The rotary products are rounded before their sum, never fused with it into a
        # bfloat16 FMA (fp32 FMAs of the sum of squares are no eager rounding skipped).
        print("rope", has_norm, block_t, len(k.asm["cubin"]),
              len(re.findall(r"fma\\.rn\\.bf16", k.asm["ptx"])))

def mmas(ptx):
    # Matrix instructions: the 16-row dot's (mma.sync) and the warpgroup's (wgmma).
    sync = len(re.findall(r"mma\\.sync", ptx))
    return str(sync) + "/" + str(len(re.findall(r"wgmma", ptx)))

LINEAR = ["*bf16"] * 3 + ["*fp32", "*bf16", "*bf16", "*fp32"] + ["i32"] * 9 + ["fp32"]
GATED = ["*bf16", "*bf16", "*fp32", "*bf16"] + ["i32"] * 7 + ["fp32"]
for fused in (True, False):
    for tiles in (1, 4):
        k = compile(_rows_linear_kernel, LINEAR,
                    dict(HAS_BIAS=False, NORM=fused, RESIDUAL=fused, SQUARES=fused,
                         ROW_TILES=tiles, BLOCK_M=16, BLOCK_N=32, BLOCK_K=512, GROUPS=256),
                    num_warps=4, num_stages=4)
        # The residual's sum is rounded as eager rounds it.
        ptx = k.asm["ptx"]
        print("linear", fused, tiles, mmas(ptx), len(k.asm["cubin"]),
              len(re.findall(r"fma\\.rn\\.bf16", ptx)))
        k = compile(_rows_gated_kernel, GATED,
                    dict(NORM=fused, ROW_TILES=tiles, BLOCK_M=16, BLOCK_N=32, BLOCK_K=128,
                         GROUPS=256), num_warps=4, num_stages=4)
        ptx = k.asm["ptx"]
        print("gated", fused, tiles, mmas(ptx), len(k.asm["cubin"]),
              len(re.findall(r"fma\\.rn\\.bf16", ptx)))

# Programmatic launch: the wait for the kernel before, then the signal to the kernel
# after, and only then any other global access (loads, asynchronous copies, stores,
# atomics), by PTX line.
from ignition.components.linear import _rows_split_kernel

def programmatic_order(ptx):
    lines = ptx.splitlines()
    def first(pattern):
        return next((i for i, line in enumerate(lines) if re.search(pattern, line)), -1)
    return [first(r"griddepcontrol\\.wait"), first(r"griddepcontrol\\.launch_dependents"),
            first(r"ld\\.global|cp\\.async\\.(ca|cg|bulk)|st\\.global|atom\\.|red\\.")]

for pdl in (True, False):
    k = compile(_rows_linear_kernel, LINEAR,
                dict(HAS_BIAS=True, NORM=True, RESIDUAL=True, SQUARES=True, ROW_TILES=2,
                     BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, GROUPS=256, PDL=pdl), num_warps=4,
                num_stages=4, launch_pdl=pdl)
    print("pdl linear", pdl, *programmatic_order(k.asm["ptx"]), k.metadata.launch_pdl)
    k = compile(_rows_gated_kernel, GATED,
                dict(NORM=True, ROW_TILES=1, BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, GROUPS=256,
                     PDL=pdl), num_warps=4, num_stages=4, launch_pdl=pdl)
    print("pdl gated", pdl, *programmatic_order(k.asm["ptx"]), k.metadata.launch_pdl)
    k = compile(_rows_split_kernel, ["*bf16", "*bf16", "*fp32"] + ["i32"] * 5,
                dict(K_SPLIT=256, BLOCK_M=16, BLOCK_N=16, BLOCK_K=128, PDL=pdl),
                num_warps=4, num_stages=4, launch_pdl=pdl)
    print("pdl split", pdl, *programmatic_order(k.asm["ptx"]), k.metadata.launch_pdl)

# Early weights: the last K step's weight tile in 16-byte loads before the wait (as a
# launch specializes the kernel: pointers and sizes divisible by 16), nothing else
# before it; after the signal the K loop's pipeline (asynchronous copies) starts at
# once. By PTX line: loads before the wait, other accesses before it, the wait, the
# signal, the first copy, and the tile's 16-byte vectors a thread loads.
def early_order(ptx):
    lines = ptx.splitlines()
    def at(pattern):
        return [i for i, line in enumerate(lines) if re.search(pattern, line)]
    wait = at(r"griddepcontrol\\.wait")[0]
    loads = [i for i in at(r"ld\\.global") if i < wait]
    wide = [i for i in at(r"ld\\.global\\.v4\\.b32") if i < wait]
    others = [i for i in at(r"cp\\.async|st\\.global|atom\\.global|red\\.global") if i < wait]
    signal = at(r"griddepcontrol\\.launch_dependents")[0]
    copy = at(r"cp\\.async\\.cg")[0]
    return [len(wide), len(loads) - len(wide) + len(others), wait, signal, copy]

def specialized(fn, types, constexprs, **options):
    names = fn.arg_names
    signature = dict(zip(names, types + ["constexpr"] * (len(names) - len(types))))
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names[:len(types)])
             if types[i] != "fp32" and name != "M"}
    return triton.compile(ASTSource(fn, signature, constexprs=defaults(fn, constexprs),
                                    attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)

# The 8B's o projection (one 32x512 step early), its qkv at four row tiles (two
# 32x256), SmolLM2's (four 32x128 of its five); the gated kernel's steps of two tiles.
# Each early step is the loop's step again after it: (1 + steps) times the late
# kernel's 16-row MMAs, no warpgroup MMA (last, as "late/early" counts).
def early_and_late(fn, types, constexprs, steps):
    kernels = [specialized(fn, types, {**constexprs, "EARLY_WEIGHTS": e}, num_warps=4,
                           num_stages=4, launch_pdl=True) for e in (steps, 0)]
    early, late = (k.asm["ptx"] for k in kernels)
    counts = [len(re.findall(r"mma\\.sync", p)) + 1000 * len(re.findall(r"wgmma", p))
              for p in (late, early)]
    return early, "/".join(map(str, counts))

for tiles, width, block_k, steps in ((1, 32, 512, 1), (4, 32, 256, 2), (1, 32, 128, 4)):
    ptx, mma = early_and_late(_rows_linear_kernel, LINEAR,
                              dict(HAS_BIAS=True, NORM=True, RESIDUAL=True, SQUARES=True,
                                   ROW_TILES=tiles, BLOCK_M=16, BLOCK_N=width, BLOCK_K=block_k,
                                   GROUPS=256, PDL=True), steps)
    print("early linear", tiles, steps, *early_order(ptx),
          steps * width * block_k * 2 // 16 // 128, mma)
for width, steps in ((32, 2), (16, 3)):  # the 8B's gate/up, SmolLM2's
    ptx, mma = early_and_late(_rows_gated_kernel, GATED,
                              dict(NORM=True, ROW_TILES=1, BLOCK_M=16, BLOCK_N=width,
                                   BLOCK_K=128, GROUPS=256, PDL=True), steps)
    print("early gated", 1, steps, *early_order(ptx), steps * 2 * width * 128 * 2 // 16 // 128,
          mma)

# The norm's statistic: the first row tile's partial squares are loaded right after
# the wait, before the K loop's first copy, and none after its last (loaded after
# the loop, they added a round trip to every program's tail). By PTX line: global
# loads before the first copy, after the last.
def squares_order(ptx):
    lines = ptx.splitlines()
    at = lambda pattern: [i for i, line in enumerate(lines) if re.search(pattern, line)]
    loads, copies = at(r"ld\\.global"), at(r"cp\\.async\\.cg")
    return [sum(i < copies[0] for i in loads), sum(i > copies[-1] for i in loads)]

k = specialized(_rows_linear_kernel, LINEAR,
                dict(HAS_BIAS=False, NORM=True, RESIDUAL=False, SQUARES=False, ROW_TILES=1,
                     BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, GROUPS=256, PDL=True),
                num_warps=4, num_stages=4, launch_pdl=True)
print("squares linear", *squares_order(k.asm["ptx"]))
k = specialized(_rows_gated_kernel, GATED,
                dict(NORM=True, ROW_TILES=1, BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, GROUPS=256,
                     PDL=True), num_warps=4, num_stages=4, launch_pdl=True)
print("squares gated", *squares_order(k.asm["ptx"]))

# The kernels of a decode layer between its projections, launched programmatically
# too: the rotary/KV write, decode attention's split and its merge (which lets the o
# projection launch at its start).
from ignition.components.triton_attention import _decode_combine_kernel, _decode_split_kernel
for pdl in (True, False):
    k = compile(_rope_write_kv_kernel, ROPE,
                dict(HEADS=32, KV_HEADS=8, HEAD_DIM=128, BLOCK=64, BLOCK_T=1, PAGE_SIZE=64,
                     HAS_NORM=True, PDL=pdl), num_warps=1, launch_pdl=pdl)
    print("pdl rope", pdl, *programmatic_order(k.asm["ptx"]), k.metadata.launch_pdl)
    k = compile(_decode_split_kernel,
                ["*bf16", "*bf16", "*i32", "*i32", "*fp32", "*fp32", "*fp32", "fp32"]
                + ["i32"] * 17,
                dict(GROUP=4, BLOCK_H=16, HEAD_DIM=128, PAGE_SIZE=64, NUM_SPLITS=16,
                     UPCAST=False, PDL=pdl), num_warps=4, num_stages=2, launch_pdl=pdl)
    print("pdl attention", pdl, *programmatic_order(k.asm["ptx"]), k.metadata.launch_pdl)
    k = compile(_decode_combine_kernel, ["*fp32", "*fp32", "*fp32", "*bf16"] + ["i32"] * 10,
                dict(HEAD_DIM=128, NUM_SPLITS=8, BLOCK_S=8, PDL=pdl), num_warps=4,
                launch_pdl=pdl)
    print("pdl merge", pdl, *programmatic_order(k.asm["ptx"]), k.metadata.launch_pdl)

# The sampler's thresholds by radix selection: a pass and the last decision compile,
# launched programmatically (the wait before any access), with no atomic whose order
# could change a sum (global or float ones; the histogram's counts are integer
# atomics in shared memory, whose sum has no order).
from ignition.components import sampling_thresholds as st

def unordered(ptx):
    return len(re.findall(r"atom\\.global|red\\.global|atom\\.[a-z.]*f32", ptx))

from ignition.components.sampling_thresholds import BINS, BITS, DIGIT, PASSES
k = compile(st._pass_kernel, ["*fp32", "*i32", "*fp32", "*i32", "*fp32", "*i32", "*fp32"]
            + ["i32"] * 5, dict(PROGRAMS=128, BINS=BINS, CHUNK=2048, DIGIT=DIGIT, BITS=BITS,
            PDL=True), num_warps=4,
            launch_pdl=True)
print("pdl thresholds", True, *programmatic_order(k.asm["ptx"]), k.metadata.launch_pdl)
print("thresholds pass", len(k.asm["cubin"]), unordered(k.asm["ptx"]))
print("barriers thresholds pass", k.asm["ptx"].count("bar.sync"), "-")
k = compile(st._finish_kernel, ["*i32", "*fp32", "*i32", "*fp32", "*i32", "*fp32", "*fp32", "*fp32"]
            + ["i32"] * 3, dict(PASSES=PASSES, PROGRAMS=128, BINS=BINS, PDL=True), num_warps=1,
            launch_pdl=True)
print("pdl thresholds-finish", True, *programmatic_order(k.asm["ptx"]), k.metadata.launch_pdl)
print("thresholds finish", len(k.asm["cubin"]), unordered(k.asm["ptx"]))

# The prefill attention kernel at its default tilings for Qwen3-8B's shape, compiled as
# a launch specializes it (16-byte aligned pointers, strides of one folded in): the
# shared memory each needs, against the SM's 227 KiB (a tiling past it compiles but
# fails at launch).
from ignition.components.triton_attention import _prefill_kernel, prefill_tiling
names = _prefill_kernel.arg_names
PREFILL_TYPES = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "page_table_ptr": "*i32",
                 "start_ptr": "*i32", "n_valid_ptr": "*i32", "out_ptr": "*bf16",
                 "qk_scale": "fp32"}
ones = ("stride_qd", "stride_kvd", "stride_od", "stride_ptp")

def prefill_kernel(tiling):
    # As a launch specializes it: unit strides folded in, pointers 16-byte aligned.
    declared = {p.name for p in _prefill_kernel.params if p.is_constexpr}
    signature = {name: PREFILL_TYPES.get(name, "constexpr" if name in declared or name in ones
                                         else "i32") for name in names}
    constexprs = dict(GROUP=4, GROUP_PAD=4, BLOCK_T=tiling.rows // 4, HEAD_DIM=128,
                      PAGE_SIZE=64, KEY_PAGES=tiling.key_pages, UPCAST=False,
                      LONGEST_FIRST=True, **{name: 1 for name in ones})
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
             if signature[name][0] in "*i"}  # pointers and integers: a launch's 16s
    return triton.compile(ASTSource(_prefill_kernel, signature, constexprs=constexprs,
                                    attrs=attrs),
                          target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=tiling.num_warps,
                                       num_stages=tiling.num_stages))

def exp2_from_fma(ptx):
    # How many exp2s take their argument straight from an fp32 FMA: each register's
    # defining instruction, then each exp2's operand.
    made = {register: op for op, register in
            re.findall(r"^\\s*(?:@!?%p\\d+\\s+)?([a-z][\\w.]*)\\s+(%\\w+),", ptx, re.M)}
    args = re.findall(r"ex2\\.approx\\S*\\s+%\\w+,\\s*(%\\w+)", ptx)
    return sum(made.get(arg, "").startswith("fma.rn.f32") for arg in args)

for tokens in (512, 4096):
    t = prefill_tiling(tokens, 4, 128)
    k = prefill_kernel(t)
    ptx = k.asm["ptx"]
    # The scale inside exp2's argument: each probability's exp2 takes one fp32 FMA
    # (s * qk_scale - m), in the masked key loop as in the unmasked one.
    print("prefill", tokens, k.metadata.shared, len(re.findall(r"cp\\.async", ptx)),
          len(re.findall(r"ex2\\.approx", ptx)), exp2_from_fma(ptx))

# The row sum of the hybrid's norms: its loop over the row and its tree (a reduction
# across the warps through shared memory) compile; no atomics, whose order could vary.
from ignition.components.row_reduce import BLOCK, _row_sum_kernel
for dtype in ("fp32", "bf16"):
    k = compile(_row_sum_kernel, ["*" + dtype, "*fp32", "i32", "i32"],
                dict(SQUARE=dtype == "bf16", BLOCK=BLOCK), num_warps=4)
    print("row_sum", dtype, len(k.asm["cubin"]), len(re.findall(r"atom\\.", k.asm["ptx"])))

# Decode attention finishing its rows' projection (ROPE): the group's queries and the
# newest K/V stored, then a barrier, before the program's next global load (its
# queries and pages read back); no load on the non-coherent path, which could miss
# the program's own stores. As a launch specializes it: unit strides folded, pointers
# aligned. By PTX line: non-coherent loads, and whether a barrier comes between the
# last 16-bit store and the next load.
from ignition.components.triton_attention import _decode_split_kernel

def stores_then_barrier(ptx):
    lines = ptx.splitlines()
    stores = [i for i, line in enumerate(lines) if re.search(r"st\\.global(\\.v\\d)?\\.b16", line)]
    loads = [i for i, line in enumerate(lines) if re.search(r"ld\\.global", line)]
    last = stores[-1]
    after = next(i for i in loads if i > last)
    barrier = any("bar.sync" in line for line in lines[last:after])
    return len(re.findall(r"ld\\.global\\.nc", ptx)), barrier

SPLIT_PTRS = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "page_table_ptr": "*i32",
              "seq_lens_ptr": "*i32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32",
              "part_acc_ptr": "*fp32", "qkv_ptr": "*bf16", "q_w_ptr": "*bf16",
              "k_w_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "rows_ptr": "*i64"}
UNIT = ("stride_qd", "stride_kvd", "stride_ptp", "stride_ms", "stride_ad")
for dim, group, norm in ((128, 4, True), (64, 3, False)):
    constexprs = dict(GROUP=group, BLOCK_H=16, HEAD_DIM=dim, PAGE_SIZE=64, NUM_SPLITS=16,
                      UPCAST=False, ROPE=True, HEADS=8 * group, HAS_NORM=norm, PDL=True,
                      **{name: 1 for name in UNIT})
    names = _decode_split_kernel.arg_names
    signature = {name: "constexpr" if name in constexprs else SPLIT_PTRS.get(
        name, "fp32" if name in ("qk_scale", "eps") else "i32") for name in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
             if name in SPLIT_PTRS}
    k = triton.compile(ASTSource(_decode_split_kernel, signature,
                                 constexprs=defaults(_decode_split_kernel, constexprs),
                                 attrs=attrs),
                       target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, num_stages=2, launch_pdl=True))
    nc, barrier = stores_then_barrier(k.asm["ptx"])
    print("split_rope", dim, nc, barrier)

# SmolLM2 decode layers in one persistent kernel, at the H200's tiles, one layer or
# stacked (the weights by address tables): its grid barriers (an arrival,
# acquire-release, by one thread each; the generation read with acquire; six sites,
# the last between layers), no non-coherent load (a phase reads what other programs
# wrote in the one before), its projections' K loops pipelined in 16-byte copies
# (the tables' addresses declared aligned), within an SM's shared memory; with
# PREFETCH its bulk L2 prefetches, the first layer's before the wait.
from ignition.components import linear
from ignition.components.persistent_layer import _persistent_layer_kernel

def shape(n, k):
    return linear.tile_shape(n, k, 132)

qkv, o, down = shape(960, 576), shape(576, 576), shape(576, 1536)
gate_up = linear.gated_tile_shape(3072, 576, 132)
PERSISTENT_PTRS = {"s_ptr": "*fp32", "pt_ptr": "*i32", "seq_ptr": "*i32", "pm_ptr": "*fp32",
                   "pl_ptr": "*fp32", "pa_ptr": "*fp32", "rows_ptr": "*i64", "hs_ptr": "*fp32",
                   "ys_base": "*fp32", "state_ptr": "*i32"}
POINTER = ("_ptr", "_tab", "_base")
for stacked in (False, True):
    constexprs = dict(HIDDEN=576, HEADS=9, KV_HEADS=3, HEAD_DIM=64, INTER=1536, PAGE_SIZE=64,
                      NUM_SPLITS=16, BLOCK_H=16, BLOCK_S=16, NORM_IN=True, HAS_NORM=True,
                      UPCAST=False, ROW_TILES=1, BLOCK_M=16, QKV_N=qkv[0], QKV_K=qkv[1],
                      O_N=o[0], O_K=o[1], GU_N=gate_up[0] // 2, GU_K=gate_up[1],
                      DOWN_N=down[0], DOWN_K=down[1], GROUPS_HIDDEN=64, GROUPS_HEADS=64,
                      PHASE=-1, STACKED=stacked, PREFETCH=True, PDL=True)
    names = _persistent_layer_kernel.arg_names
    signature = {name: "constexpr" if name in constexprs else
                 "*i64" if stacked and name.endswith("_tab") else PERSISTENT_PTRS.get(
        name, "*bf16" if name.endswith(POINTER) else
        "fp32" if name in ("eps", "norm_eps", "qk_scale") else "i32") for name in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
             if name.endswith(POINTER)}
    k = triton.compile(ASTSource(_persistent_layer_kernel, signature, constexprs=constexprs,
                                 attrs=attrs),
                       target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, num_stages=4, launch_pdl=True,
                                    enable_fp_fusion=False))
    ptx = k.asm["ptx"]
    prefetches = [m.start() for m in re.finditer(r"cp\\.async\\.bulk\\.prefetch\\.L2", ptx)]
    copy = r"cp\\.async\\.c[ag]\\.shared\\.global \\[[^]]*\\], \\[[^]]*\\], (\\w+)"
    copies = re.findall(copy, ptx)
    # Layer i's cache at kv_base + i * stride_layer: in int64 (past 2^31 elements).
    wide = "arith.extsi %stride_layer : i32 to i64" in k.asm["ttir"]
    print("persistent", stacked, wide,
          len(re.findall(r"@%p\\d+ atom\\.global\\.gpu\\.acq_rel\\.add", ptx)),
          len(re.findall(r"ld\\.global\\.nc", ptx)), len(copies),
          sum(size != "0x10" for size in copies), k.metadata.shared, len(prefetches),
          min(prefetches) < ptx.index("griddepcontrol.wait"))

# The two-rank collectives: their system-scope and device-scope synchronization, in
# PTX order.
from ignition.parallel.window_collectives import (
    BROADCAST, COUNTER, DONE, GATHER, LIMIT, REDUCE, _exchange_kernel,
)

for mode in (REDUCE, GATHER, BROADCAST):
    ptx = compile(_exchange_kernel, ["*bf16"] * 4 + ["*i64"] * 2 + ["i32"] * 4,
                  dict(RANK=1, MODE=mode, BF16=True, BLOCK=1024, COUNTER=COUNTER,
                       DONE=DONE, LIMIT=LIMIT, TIMED=True)).asm["ptx"]
    ops = re.findall(r"(?:atom|ld)\\.global\\.(?:sys|gpu)\\.[a-z_]+\\.[a-z]+", ptx)
    print("exchange", mode, " ".join(ops), "x")
    print("bounded", mode, ptx.count("%globaltimer"), ptx.count("trap;"), "x")
    # Inside the wait: the last poll, then a timer read, then the trap.
    print("order", mode, ptx.rindex("ld.global.sys.acquire") < ptx.rindex("%globaltimer")
          < ptx.rindex("trap;"), "x")
"""


def test_the_new_kernels_compile_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = {tuple(line.split()[:-2]): line.split()[-2:] for line in done.stdout.splitlines()}
    # The rows kernels' lines: kernel, fused, row tiles, then MMAs, cubin and FMAs.
    rows = {
        tuple(parts[:3]): parts[3:]
        for parts in map(str.split, done.stdout.splitlines())
        if parts[0] in ("linear", "gated")
    }
    persistent = [line.split()[1:] for line in done.stdout.splitlines()
                  if line.startswith("persistent ")]  # fmt: skip
    assert len(persistent) == 2, done.stdout
    for stacked, wide, arrivals, nc, copies, narrow, shared, prefetches, early in persistent:
        assert wide == "True", done.stdout
        assert arrivals == "6" and nc == "0", done.stdout
        assert int(copies) > 0 and narrow == "0" and 0 < int(shared) <= 232448, done.stdout
        # The five weights' tiles: the first layer's, and stacked each next layer's.
        assert prefetches == ("10" if stacked == "True" else "5") and early == "True"
    for dim in ("128", "64"):
        nc, barrier = found[("split_rope", dim)]
        assert nc == "0" and barrier == "True", done.stdout
    for has_norm in ("True", "False"):
        for block_t in ("1", "16"):  # decode's tile and a prefill chunk's
            cubin, fmas = found[("rope", has_norm, block_t)]
            assert int(cubin) > 0 and int(fmas) == 0, done.stdout
    for kernel in ("linear", "gated"):
        for fused in ("True", "False"):
            one = rows[(kernel, fused, "1")]
            four = rows[(kernel, fused, "4")]
            for _, cubin, fmas in (one, four):
                assert int(cubin) > 0 and int(fmas) == 0, done.stdout
            # Four row tiles run four times the one tile's 16-row MMAs (no warpgroup
            # MMA, whose reduction order could differ): each row's arithmetic is one
            # tile's at any row count.
            sync_one, group_one = map(int, one[0].split("/"))
            sync_four, group_four = map(int, four[0].split("/"))
            assert sync_one > 0 and sync_four == 4 * sync_one, done.stdout
            assert group_one == group_four == 0, done.stdout
    for part in ("pass", "finish"):
        cubin, atomics = found[("thresholds", part)]
        assert int(cubin) > 0 and int(atomics) == 0, done.stdout
    # A pass's reductions across its threads, each with its barriers, are what it
    # costs: the masses in one tile reduced once, the decisions in four reductions for
    # both filters (a masked sum a bin and eight in the decisions gave 62 barriers).
    barriers, _ = found[("barriers", "thresholds", "pass")]
    assert int(barriers) <= 13, done.stdout
    for dtype in ("fp32", "bf16"):
        cubin, atomics = found[("row_sum", dtype)]
        assert int(cubin) > 0 and int(atomics) == 0, done.stdout
    pdl = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("pdl ")]
    assert len(pdl) == 14, done.stdout
    for kernel, on, *at, launch_pdl in pdl:
        at_wait, at_signal, at_access = map(int, at)
        assert launch_pdl == on, (kernel, on, at)
        if on == "True":
            assert 0 <= at_wait < at_signal < at_access, (kernel, at)
        else:
            # Without it, no grid dependency control at all (a plain launch).
            assert at_wait == at_signal == -1 and at_access >= 0, (kernel, at)
    early = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("early ")]
    assert len(early) == 5, done.stdout
    for kernel, tiles, steps, wide, other, wait, signal, copy, vectors, mma in early:
        # Only the last steps' weight tiles, whole, before the wait; the loop's copies
        # right after the signal.
        assert int(wide) == int(vectors) > 0 and int(other) == 0, (kernel, tiles, done.stdout)
        assert int(wait) < int(signal) < int(copy), (kernel, tiles, done.stdout)
        # The same 16-row MMAs as the loop's, once per early step more.
        late, early_mma = map(int, mma.split("/"))
        assert 0 < late < 1000 and early_mma == (1 + int(steps)) * late, (kernel, mma)
    for kernel in ("linear", "gated"):
        # 16 rows of 256 partial squares over 128 threads: 32 loads, all before the loop.
        assert found[("squares", kernel)] == ["32", "0"], done.stdout
    prefill = {
        parts[1]: list(map(int, parts[2:]))
        for parts in map(str.split, done.stdout.splitlines())
        if parts[0] == "prefill"
    }
    # The collectives' signal is a release exchange and their wait an acquire load,
    # both at system scope (the peer is another device); the count of programs done
    # and the epoch counter stay on the device (GPU scope).
    exchanges = [line.split()[2:-1] for line in done.stdout.splitlines()
                 if line.startswith("exchange ")]  # fmt: skip
    assert len(exchanges) == 3, done.stdout  # reduce, gather, broadcast
    # The wait is bounded: the global timer read before and during it, and a trap.
    bounded = [line.split()[2:-1] for line in done.stdout.splitlines()
               if line.startswith("bounded ")]  # fmt: skip
    assert len(bounded) == 3 and all(
        int(timers) >= 2 and int(traps) >= 1 for timers, traps in bounded
    ), done.stdout
    order = [line.split()[2] for line in done.stdout.splitlines() if line.startswith("order ")]
    assert order == ["True"] * 3, done.stdout
    for ops in exchanges:
        assert ops[0] == "atom.global.sys.release.exch", ops  # the signal
        assert set(ops[1:-3]) == {"ld.global.sys.acquire.b"}, ops  # the wait's polls
        assert ops[-3:] == ["atom.global.gpu.acq_rel.add", "atom.global.gpu.relaxed.exch",
                            "atom.global.gpu.release.exch"], ops  # fmt: skip
    for tokens in ("512", "4096"):
        shared, copies, exp2s, from_fma = prefill[tokens]
        # Fits the H200's shared memory per block, and streams keys and values
        # asynchronously (the loop is software-pipelined).
        assert 0 < shared <= 232448 and copies > 0, done.stdout
        # The scale inside exp2's argument: every probability's exp2 takes an FMA, in
        # both key loops; only the rescale factors exp2(m_i - m_new), one a row, take a
        # subtraction (4 of 68 and 4 of 132 exp2s here). Scaling the scores first left
        # the masked loop's to a subtraction after the mask (36 of 68, 68 of 132).
        assert exp2s > 0 and exp2s - from_fma <= exp2s // 8, done.stdout

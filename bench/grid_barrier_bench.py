"""What a phase boundary costs on the GPU: a grid barrier inside one persistent kernel
against a kernel boundary in a CUDA graph (plain and programmatic launches).

A small model's decode step is a chain of dependent phases (a layer's projections,
attention, its merge), each of which needs the whole previous phase's output. Today
each phase is a kernel, and SmolLM2-135M's take 3 to 4 us each whatever their
bytes. A persistent decode would replace each kernel boundary with a barrier across
the resident programs. This measures the two boundaries alone, each as a CUDA graph
replayed in blocks (medians and p99 over the replays):

- ``barrier``: one kernel of one program per SM (4 warps) crossing ``--rounds``
  barriers: each program adds one to a counter (release) and spins on an acquire load
  until every program has arrived; the replay's time over the rounds is one barrier;
- ``barrier-exchange``: the same, each program also writing a value before the
  barrier and reading its neighbour's after it (the data a phase hands on);
- ``plain`` and ``programmatic``: ``--rounds`` empty kernels of the same grid in a
  graph (each reads one value the one before wrote), launched plainly or with
  programmatic dependent launch (each waits for the one before, then lets the next
  launch); the replay's time over the kernels is one boundary.

    python -m bench.grid_barrier_bench --out OUT.json   (PYTHONPATH: the repository)
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from bench.cuda_timing import blocks_us, capture, run_measurement
from ignition.components.persistent_layer import load_acquire
from ignition.components.programmatic_launch import (
    await_producer,
    kernel_options,
    programmatic_launch,
)


@triton.jit
def _barrier_kernel(counter_ptr, data_ptr, rounds, EXCHANGE: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    value = pid
    for r in range(rounds):
        if EXCHANGE:
            tl.store(data_ptr + (r % 2) * programs + pid, value)
        tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
        target = (r + 1) * programs
        seen = load_acquire(counter_ptr)
        while seen < target:
            seen = load_acquire(counter_ptr)
        if EXCHANGE:
            value = tl.load(data_ptr + (r % 2) * programs + (pid + 1) % programs) + 1
    if EXCHANGE:
        tl.store(data_ptr + 2 * programs + pid, value)


@triton.jit
def _hand_on_kernel(src_ptr, dst_ptr, PDL: tl.constexpr = False):
    if PDL:
        await_producer()
    pid = tl.program_id(0)
    tl.store(dst_ptr + pid, tl.load(src_ptr + pid) + 1)


def measure(args: argparse.Namespace) -> dict:
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    data = torch.zeros(3 * sms, dtype=torch.int32, device=device)
    buffers = [torch.zeros(sms, dtype=torch.int32, device=device) for _ in range(2)]
    rounds = args.rounds

    def barrier(exchange: bool) -> None:
        counter.zero_()
        _barrier_kernel[(sms,)](counter, data, rounds, EXCHANGE=exchange, num_warps=4)

    def chain(programmatic: bool) -> None:
        with programmatic_launch(programmatic):
            options = kernel_options(device)
            for i in range(rounds):
                src, dst = buffers[i % 2], buffers[(i + 1) % 2]
                _hand_on_kernel[(sms,)](src, dst, num_warps=4, **options)

    graphs = {
        "barrier": capture(lambda: barrier(False)),
        "barrier-exchange": capture(lambda: barrier(True)),
        "plain": capture(lambda: chain(False)),
        "programmatic": capture(lambda: chain(True)),
        # The fixed cost of a replay: the counter's reset and one round.
        "empty": capture(lambda: counter.zero_()),
    }
    timed = blocks_us(graphs, args.replays, args.blocks)
    empty = timed["empty"]["median_us"]
    per_boundary = {
        name: (timed[name]["median_us"] - empty) / rounds for name in graphs if name != "empty"
    }
    # Program p ends at its neighbour's value plus one, every round:
    # (p + rounds) % programs + rounds, only if each read saw that round's write.
    expected = (torch.arange(sms) + rounds) % sms + rounds
    exchange_ok = torch.equal(data[2 * sms :].cpu().long(), expected)
    for name, us in per_boundary.items():
        print(f"{name}: {us:.3f} us a boundary ({timed[name]['median_us']:.1f} us a replay)")
    print("exchange", "ok" if exchange_ok else "WRONG")
    return {
        "device": torch.cuda.get_device_name(device),
        "sms": sms,
        "rounds": rounds,
        "replays": args.replays,
        "blocks": args.blocks,
        "graphs": timed,
        "per_boundary_us": per_boundary,
        "exchange_ok": exchange_ok,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    return run_measurement(parser, measure, argv)


if __name__ == "__main__":
    raise SystemExit(main())

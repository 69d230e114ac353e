"""`sim5d collective OP --topology T --gpus N --size BYTES [--algorithm ...] [--json]`:
nccl-tests in simulation. `--sizes MIN:MAX[:FACTOR]` times a sweep. The table is nccl-tests' own
(`--format nccl-tests`, the default: its columns, out-of-place and in-place, and its footer, so
scripts that parse nccl-tests parse it) or sim5d's with the algorithm and protocol chosen
(`--format sim5d`). Sizes read as nccl-tests reads -b/-e: K, M, G are binary (1K = 1024)."""

from __future__ import annotations

import json
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("collective")
    def collective_cmd(
        op: str = typer.Argument(..., help="all_reduce | all_gather | reduce_scatter | all_to_all | "
                                           "broadcast | send_recv"),
        topology: str = typer.Option(..., "--topology", help="Bundled topology name or a topology YAML path."),
        gpus: int = typer.Option(..., "--gpus", help="Ranks: the first N GPUs of the fewest nodes that hold them."),
        size: Optional[str] = typer.Option(
            None, "--size", help="Bytes; K, M, G binary as nccl-tests (1K = 1024), or KiB, MiB, GiB."),
        sizes: Optional[str] = typer.Option(
            None, "--sizes", help="MIN:MAX[:FACTOR] sweep as nccl-tests -b MIN -e MAX -f FACTOR "
                                  "(default 2), e.g. 1K:8G."),
        algorithm: str = typer.Option("auto", "--algorithm",
                                      help="ring | tree | auto (also nvls, hierarchical for all_reduce)."),
        protocol: str = typer.Option("auto", "--protocol", help="auto | LL | LL128 | Simple."),
        network: str = typer.Option("flow", "--network", help="flow (max-min sharing) | analytical (alpha-beta)."),
        fmt: str = typer.Option(
            "nccl-tests", "--format", help="nccl-tests (its columns and footer) | sim5d (size, "
                                           "count, time, algbw, busbw, algo, proto)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout "
                                                           "(whatever --format)."),
    ) -> None:
        """Time one collective like nccl-tests: time, algbw, busbw (GB/s = 1e9 B/s)."""
        from sim.errors import ConfigError
        from sim.network.collectives import OPS, simulate_collective
        from sim.network.flow import NETWORK_MODES
        from sim.network import nccl_tests as NT
        from sim.network.nccl_tests import elements, parse_nccl_size, parse_size_range
        from sim.suggest import did_you_mean
        from sim.commands.topology import check_gpu
        from sim.topology import load_topology
        from sim.topology.graph import build_graph, nodes_for

        if op not in OPS:
            raise ConfigError(f"OP = {op!r} must be one of {', '.join(OPS)}{did_you_mean(op, OPS)}", key="OP")
        if network not in NETWORK_MODES:
            raise ConfigError(f"--network = {network!r} must be one of {', '.join(NETWORK_MODES)}",
                              key="--network")
        formats = ("nccl-tests", "sim5d")
        if fmt not in formats:
            raise ConfigError(f"--format = {fmt!r} must be one of {', '.join(formats)}"
                              f"{did_you_mean(fmt, formats)}", key="--format")
        if (size is None) == (sizes is None):
            raise ConfigError("give exactly one of --size BYTES or --sizes MIN:MAX", key="--size")
        if gpus < 1:
            raise ConfigError(f"--gpus = {gpus} must be a positive integer", key="--gpus")
        if size is not None:
            size_list = [parse_nccl_size(size, key="--size")]
        else:
            size_list = parse_size_range(sizes)
        topo = load_topology(topology, key="--topology")
        check_gpu(topo)
        graph = build_graph(topo, nodes_for(topo, gpus, "--gpus"))
        tested = [NT.tested_bytes(op, nb, gpus) for nb in size_list]   # what nccl-tests moves
        rows = [simulate_collective(topo, op, gpus, nb, algorithm=algorithm, protocol=protocol,
                                    network=network, graph=graph) for nb in tested]
        head = {"op": op, "topology": topo.name, "gpus": gpus, "nodes": graph.graph["num_nodes"],
                "network": network}
        if as_json:
            js = [{**r.to_json(), "requested_bytes": nb} for r, nb in zip(rows, size_list)]
            out = {**head, **js[0]} if size is not None else {**head, "rows": js}
            typer.echo(json.dumps(out))
            return
        typer.echo(f"# sim5d collective {op} on {topo.name}: {gpus} GPUs on {graph.graph['num_nodes']} "
                   f"node(s), network={network}, algorithm={algorithm}, protocol={protocol}")
        _say_cut(NT, op, size_list, tested)
        if fmt == "nccl-tests":
            for line in _nccl_tests_lines(NT, op, gpus, size_list, sizes is not None, rows):
                typer.echo(line)
            return
        typer.echo("#")
        typer.echo(f"# {'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'time':>11} {'algbw':>8} "
                   f"{'busbw':>8}  {'algo':<12} proto")
        typer.echo(f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'(us)':>11} {'(GB/s)':>8} {'(GB/s)':>8}")
        redop = "sum" if op in ("all_reduce", "reduce_scatter") else "none"
        for r in rows:
            typer.echo(f"  {r.nbytes:>12} {elements(op, r.nbytes, gpus):>12} {'float':>6} {redop:>6} "
                       f"{r.time_ns / 1e3:>11.2f} {r.algbw_gbps:>8.2f} {r.busbw_gbps:>8.2f}  "
                       f"{r.algorithm:<12} {r.protocol}")


def _say_cut(NT, op: str, size_list: list, tested: list) -> None:
    """A `#` line where a requested size is not what nccl-tests moves (NT.tested_bytes)."""
    cut = [(a, b) for a, b in zip(size_list, tested) if a != b]
    if cut:
        typer.echo("# size: the bytes nccl-tests moves, "
                   + ("each rank's part whole 16-byte blocks" if op in NT.PER_RANK_OPS else "whole floats")
                   + f" ({len(cut)} of {len(size_list)} sizes cut, e.g. {cut[0][0]} -> {cut[0][1]})")


def _nccl_tests_lines(NT, op: str, gpus: int, size_list: list, sweep: bool, rows) -> list:
    """The simulated results as nccl-tests prints them (NVIDIA/nccl-tests src/util.cu), after
    `#` lines saying what differs from a measurement."""
    step = ""
    if sweep and len(size_list) > 1:
        step = f" step: {size_list[1] // size_list[0]}(factor)"
    lines = [
        f"# Simulated {NT.PERF_BINARY[op]}: minBytes {size_list[0]} maxBytes {size_list[-1]}{step} "
        "validation: 0",
        "# Out-of-place and in-place: the same simulated time (sim5d does not model where the "
        "buffers are), so both column groups are equal.",
        "# #wrong: N/A, as nccl-tests prints without data checking (-c 0): nothing is moved or "
        "checked.",
        "# Sizes: K, M, G are binary as nccl-tests reads -b/-e (1K = 1024). GB/s = 1e9 B/s.",
        "#",
        *NT.table_header(),
    ]
    for r in rows:
        lines.append(NT.table_row(op, gpus, r.nbytes, r.time_ns / 1e3, r.algbw_gbps, r.busbw_gbps))
    lines += NT.table_footer([r.busbw_gbps for r in rows])
    return lines

"""`sim5d collective OP --topology T --gpus N --size BYTES [--algorithm ...] [--json]`:
nccl-tests in simulation. `--sizes MIN:MAX[:FACTOR]` prints the nccl-tests table instead."""

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
        size: Optional[str] = typer.Option(None, "--size", help="Bytes, with suffixes (1GiB, 512MB)."),
        sizes: Optional[str] = typer.Option(None, "--sizes", help="MIN:MAX[:FACTOR] sweep, e.g. 1KiB:8GiB."),
        algorithm: str = typer.Option("auto", "--algorithm",
                                      help="ring | tree | auto (also nvls, hierarchical for all_reduce)."),
        protocol: str = typer.Option("auto", "--protocol", help="auto | LL | LL128 | Simple."),
        network: str = typer.Option("flow", "--network", help="flow (max-min sharing) | analytical (alpha-beta)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    ) -> None:
        """Time one collective like nccl-tests: time, algbw, busbw (GB/s = 1e9 B/s)."""
        from sim.errors import ConfigError
        from sim.network.collectives import OPS, simulate_collective
        from sim.network.flow import NETWORK_MODES
        from sim.network.nccl_tests import elements, parse_size_range
        from sim.suggest import did_you_mean
        from sim.topology import load_topology
        from sim.topology.graph import build_graph, nodes_for
        from sim.units import parse_size_bytes

        if op not in OPS:
            raise ConfigError(f"OP = {op!r} must be one of {', '.join(OPS)}{did_you_mean(op, OPS)}", key="OP")
        if network not in NETWORK_MODES:
            raise ConfigError(f"--network = {network!r} must be one of {', '.join(NETWORK_MODES)}",
                              key="--network")
        if (size is None) == (sizes is None):
            raise ConfigError("give exactly one of --size BYTES or --sizes MIN:MAX", key="--size")
        if gpus < 1:
            raise ConfigError(f"--gpus = {gpus} must be a positive integer", key="--gpus")
        if size is not None:
            try:
                size_list = [parse_size_bytes(size)]
            except ValueError as e:
                raise ConfigError(f"--size: {e}", key="--size") from None
        else:
            size_list = parse_size_range(sizes)
        topo = load_topology(topology, key="--topology")
        graph = build_graph(topo, nodes_for(topo, gpus))
        rows = []
        for nb in size_list:
            r = simulate_collective(topo, op, gpus, nb, algorithm=algorithm, protocol=protocol,
                                    network=network, graph=graph)
            rows.append(r)
        head = {"op": op, "topology": topo.name, "gpus": gpus, "nodes": graph.graph["num_nodes"],
                "network": network}
        if as_json:
            if size is not None:
                out = {**head, **rows[0].to_json()}
            else:
                out = {**head, "rows": [r.to_json() for r in rows]}
            typer.echo(json.dumps(out))
            return
        typer.echo(f"# sim5d collective {op} on {topo.name}: {gpus} GPUs on {graph.graph['num_nodes']} "
                   f"node(s), network={network}, algorithm={algorithm}, protocol={protocol}")
        typer.echo("#")
        typer.echo(f"# {'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'time':>11} {'algbw':>8} "
                   f"{'busbw':>8}  {'algo':<12} proto")
        typer.echo(f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'(us)':>11} {'(GB/s)':>8} {'(GB/s)':>8}")
        redop = "sum" if op in ("all_reduce", "reduce_scatter") else "none"
        for r in rows:
            typer.echo(f"  {r.nbytes:>12} {elements(op, r.nbytes, gpus):>12} {'float':>6} {redop:>6} "
                       f"{r.time_ns / 1e3:>11.2f} {r.algbw_gbps:>8.2f} {r.busbw_gbps:>8.2f}  "
                       f"{r.algorithm:<12} {r.protocol}")

"""`sim5d topology NAME [--nodes N] [--plot FILE.png] [--json]`: what a cluster offers."""

from __future__ import annotations

import json
from typing import Optional

import typer


def check_gpu(topo) -> None:
    """A topology's `gpu:` names a device profile (a bundled name or a path), as a scenario on it
    would require: `sim5d topology` and `collective` had shown `gpu: nosuch-gpu` without a word."""
    from sim.devices import load_device
    from sim.errors import ConfigError

    try:
        load_device(topo.gpu, key="gpu")
    except ConfigError as e:
        raise e.located(topo.path or None, None) from None


def register(app: typer.Typer) -> None:
    @app.command("topology")
    def topology_cmd(
        name: str = typer.Argument(..., help="Bundled topology name or a topology YAML path."),
        nodes: Optional[int] = typer.Option(None, "--nodes", help="Servers in the cluster (default: one NVLink "
                                            "domain, e.g. an NVL72 rack's 18 trays, else 1)."),
        domain_nodes: Optional[int] = typer.Option(
            None, "--domain-nodes", help="Servers of each NVLink domain the job gets (topologies with an "
            "nvlink_domain, e.g. 16 of an NVL72 rack's 18 trays); default: the topology's job_nodes, else "
            "NVIDIA's Slurm segment rule (the greatest divisor of --nodes that fits a domain)."),
        plot: Optional[str] = typer.Option(None, "--plot", help="Draw the cluster to this chart file (.png, "
                                           ".svg, .pdf; 32+ nodes: nodes 0, 1 and the last, the fabric summarised)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    ) -> None:
        """GPUs, links by class, per-GPU injection and bisection bandwidth of a cluster."""
        from sim.errors import ConfigError
        from sim.topology import load_topology, with_domain_nodes
        from sim.topology.graph import build_graph
        from sim.topology.summary import plot_graph, summarize

        if nodes is not None and nodes < 1:
            raise ConfigError(f"--nodes = {nodes} must be a positive integer", key="--nodes")
        topo = load_topology(name, key="topology")
        check_gpu(topo)
        if nodes is None:                  # a rack-scale system is shown whole, not one of its trays
            nodes = topo.nvlink_domain.nodes if topo.nvlink_domain is not None else 1
        topo = with_domain_nodes(topo, domain_nodes, key="--domain-nodes")
        G = build_graph(topo, nodes)
        s = summarize(G, bisection=G.graph["num_nodes"] <= 256)
        if plot:
            from pathlib import Path

            from sim.report import check_chart_path

            # as the other commands' --plot: any chart suffix, its folder made, checked the same way
            check_chart_path(Path(plot), "--plot", "topology.png")
            try:
                plot_graph(G, plot)
            except OSError as e:
                raise ConfigError(f"--plot {plot}: cannot write ({e.strerror})", key="--plot") from None
            s["plot"] = plot
        if as_json:
            typer.echo(json.dumps(s))
            return
        _render(s)


def _render(s: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    f = s["fabric"]
    c.print(f"[bold]{s['topology']}[/bold]: {s['num_nodes']} node(s) x {s['gpus_per_node']} {s['gpu']} = "
            f"{s['num_gpus']} GPUs (max {s['max_nodes']} nodes); GPUs on {s['gpu_interconnect']}, "
            f"{s['nics_per_node']} NIC(s)/node; fabric {f.get('kind', 'none')}"
            + (f" ({s['technology']}, {f['tiers']} tier(s), {f.get('routing')} routing)" if f.get("kind") != "none" else ""))
    t = Table(title="links by class", title_justify="left")   # (a long title wrapped over the narrow table)
    t.add_column("class")
    t.add_column("links", justify="right")
    t.add_column("GB/s each way", justify="right")
    for cls, d in s["links"].items():
        bw = d["bandwidth_gbps"]
        t.add_row(cls, str(d["links"]), ", ".join(f"{x:g}" for x in bw) if isinstance(bw, list) else f"{bw:g}")
    c.print(t)
    inj = s["injection_gbps_per_gpu"]
    c.print("All figures are achievable GB/s (1e9 B/s), one direction:", highlight=False)
    dom = s["nvlink_domain"]
    where = "inside the NVLink domain" if dom["max_nodes_per_domain"] > 1 else "inside the node"
    c.print(f"per-GPU injection: {inj['intra_node']:g} GB/s {where} (one GPU's link into the "
            f"GPU interconnect), {inj['inter_node']:g} GB/s into the network (the node's NICs / its GPUs)",
            highlight=False)
    if dom["max_nodes_per_domain"] > 1:
        c.print(f"NVLink domain: {dom['nodes_per_domain']} of {dom['max_nodes_per_domain']} nodes per domain "
                f"({dom['gpus_per_domain']} GPUs on one NVLink switch fabric), {dom['domains']} domain(s); "
                "GPUs of one domain talk over NVLink whichever node they are in", highlight=False)
    if s.get("nvls_gbps_per_gpu") and s.get("nvls_allreduce_busbw_gbps"):
        g = dom["gpus_per_domain"]
        c.print(f"NVLink SHARP (NVLS): {s['nvls_gbps_per_gpu']:g} GB/s per GPU through the switch's multimem "
                f"engine (an all-reduce moves S(n+1)/n each way), so an NVLS all-reduce on {g} GPUs has "
                f"busbw {s['nvls_gbps_per_gpu']:g} x 2({g}-1)/({g}+1) = "
                f"{s['nvls_allreduce_busbw_gbps']:.1f} GB/s",
                highlight=False)
    if "bisection_gbps" in s:
        inside = s["num_nodes"] == 1
        # halves that share an NVLink domain (a sending node and a receiving one in it) also meet
        # over NVLink: the first n // 2 nodes send, node i is in domain i // nodes_per_domain
        k, half = dom["nodes_per_domain"], s["num_nodes"] // 2
        shared = {i // k for i in range(half)} & {i // k for i in range(half, s["num_nodes"])}
        bound = ("intra-node" if inside else "NVLink + network" if shared else "network")
        c.print(f"bisection: {s['bisection_gbps']:.1f} GB/s from the first half of the "
                f"{'GPUs' if inside else 'nodes'} to the second (max-flow"
                f"{' over the GPU interconnect' if inside else ''}), {s['bisection_gbps_per_gpu']:.1f} GB/s "
                f"per sending GPU (at most its {bound} injection)",
                highlight=False)
    if s.get("plot"):
        c.print(f"drawing: {s['plot']}")

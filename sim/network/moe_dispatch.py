"""MoE token dispatch as DeepEP and HybridEP run it: each token crosses the network once per
destination node, then fans out over NVLink.

Megatron-Core's flex token dispatcher (`--moe-token-dispatcher-type flex`,
`--moe-flex-dispatcher-backend deepep|hybridep`; megatron/core/transformer/moe/token_dispatcher.py
MoEFlexTokenDispatcher) hands the routing map to DeepEP (deepseek-ai/DeepEP, "normal" kernels:
NVLink and RDMA forwarding) or HybridEP. Unlike the alltoall dispatcher, which sends one copy of a
token per routed expert (tokens x topk rows through NCCL's all-to-all), they send a token's
hidden state at most once to each node that holds one of its experts, over RDMA to the GPU of
the same local index on that node (rail-aligned), and that GPU forwards it over NVLink to each
GPU of its node holding one of the token's experts (DeepEP's tests count exactly these bytes:
tests/legacy/test_internode.py, `num_rdma_token_sent` = tokens x distinct destination nodes,
`recv_x` = tokens x distinct destination ranks). The RDMA and NVLink legs are pipelined in
chunks by one kernel, so they run concurrently here (one phase). The combine is the same
traffic in reverse (the forwarding GPU reduces its node's expert outputs before the RDMA leg),
and the backward the same two again.

Expected bytes, under uniform routing (every expert equally likely: i.i.d. router scores; the
measured skew stays `training.moe_routing_imbalance`, which scales the busiest rank's volume): a
token uses a set of experts S (a node's or a GPU's) with probability 1 - P(none of its top-k in
S). Without group limits the top-k of i.i.d. scores is a uniform k-subset: P(none) =
C(E - |S|, k) / C(E, k). With group-limited routing (`moe_router_num_groups` G,
`moe_router_group_topk` g; Megatron-Core moe_utils.group_limited_topk, DeepSeek-V3's
node-limited routing) g of the G equal groups (n = E / G experts each) are chosen by the sum of
their top k/g scores, so each chosen group holds about k/g of the token's experts (a Monte Carlo
of group_limited_topk on i.i.d. scores, 256 experts in 8 groups, top 4 groups, top 8: 3.95
distinct groups per token of 4; tests/test_moe_dispatch.py): P(none) = the mean over the
g-subsets C of prod_{j in C} C(n - |S n group j|, k/g) / C(n, k/g). Where g does not divide k,
the k experts are taken uniformly over the chosen groups' g n experts (the subset sums counted
exactly).

"Node": DeepEP (V1, NVSHMEM) forwards over NVLink only inside a server (its NVL_PEERS = 8) and
uses RDMA between servers; HybridEP forwards inside the whole NVLink domain (an NVL72 rack;
Megatron-Core: "only hybridep backend supports the MNNVL case").

The latency is one call's: NCCL's base latency plus one network step (when the ranks span
nodes) and one NVLink step, since one kernel drives all peers at once (sim.topology.schema
CollectiveSpec; DeepEP's own fixed cost is not measured here).
"""

from __future__ import annotations

import math
from functools import lru_cache

from sim.errors import ConfigError

BACKENDS = ("deepep", "hybridep")


@lru_cache(maxsize=4096)
def miss_probability(counts: tuple, num_experts: int, topk: int, num_groups: int, group_topk: int) -> float:
    """P(a token routes none of its top-k experts into a set S); `counts[j]` = |S n group j| for
    the num_groups equal groups of experts (one group: no group limit). See the module docstring."""
    if num_groups <= 1:
        return math.comb(num_experts - sum(counts), topk) / math.comb(num_experts, topk)
    n = num_experts // num_groups
    if topk % group_topk == 0:
        # each chosen group holds topk / group_topk of the token's experts: the mean of
        # prod_{j in C} C(n - a_j, q) / C(n, q) over the g-subsets C, an elementary symmetric sum
        q = topk // group_topk
        e = [1.0] + [0.0] * group_topk
        for a in counts:
            r = math.comb(n - a, q) / math.comb(n, q)
            for c in range(group_topk, 0, -1):
                e[c] += e[c - 1] * r
        return e[group_topk] / math.comb(num_groups, group_topk)
    # otherwise the top-k uniform over the chosen groups' M = g n experts
    m = group_topk * n
    total = sum(counts)
    ways = [[0] * (total + 1) for _ in range(group_topk + 1)]   # ways[c][s]: c groups, s of S
    ways[0][0] = 1
    for a in counts:
        for c in range(group_topk, 0, -1):
            row, prev = ways[c], ways[c - 1]
            for x in range(total, a - 1, -1):
                if prev[x - a]:
                    row[x] += prev[x - a]
    num = sum(w * math.comb(m - x, topk) for x, w in enumerate(ways[group_topk]) if w)
    return num / (math.comb(num_groups, group_topk) * math.comb(m, topk))


def use_probability(experts: range | list, routing: tuple) -> float:
    """P(a token routes at least one top-k expert into `experts`); routing = (backend,
    num_experts, topk, num_groups, group_topk)."""
    _backend, e, k, g_n, g_k = routing
    groups = max(g_n, 1)
    per = e // groups
    counts = [0] * groups
    for x in experts:
        counts[x // per] += 1
    return 1.0 - miss_probability(tuple(counts), e, k, groups, g_k)


def units_of(G, ranks: list, backend: str) -> list:
    """The forwarding units of `ranks` (GPU names): each rank's server (deepep) or NVLink domain
    (hybridep; the server where there is none), as lists of ranks in local-index order, in order
    of their first rank."""
    nodes = G.nodes
    key = (lambda g: nodes[g]["server"]) if backend == "deepep" else \
        (lambda g: nodes[g].get("domain", nodes[g]["server"]))
    out: dict = {}
    for g in ranks:
        out.setdefault(key(g), []).append(g)
    return [sorted(u, key=lambda g: (nodes[g]["server"], nodes[g]["index"])) for u in out.values()]


def dispatch_flows(G, ranks: list, nbytes: int, routing: tuple) -> tuple:
    """The dispatch's flows: ({(src, dst): bytes} over the network (to the rail peer of each
    other unit), {(src, dst): bytes} over NVLink (forwarded and local)). `ranks` in expert-parallel
    order (rank i holds experts [i E / ep, (i + 1) E / ep)); `nbytes` is one copy of each of a
    rank's tokens (tokens x hidden x bytes)."""
    backend, e, _k, _gn, _gk = routing
    n = len(ranks)
    if e % n:
        raise ConfigError(f"{e} experts do not divide over {n} expert-parallel ranks", key="num_experts")
    per = e // n
    index = {g: i for i, g in enumerate(ranks)}
    units = units_of(G, ranks, backend)
    unit_of = {g: u for u, members in enumerate(units) for g in members}
    experts = lambda g: range(index[g] * per, (index[g] + 1) * per)   # noqa: E731
    p_rank = {g: use_probability(experts(g), routing) for g in ranks}
    p_unit = [use_probability([x for g in u for x in experts(g)], routing) for u in units]
    net: dict = {}
    nvl: dict = {}
    for src in ranks:
        us = unit_of[src]
        pos = units[us].index(src)
        for u, members in enumerate(units):
            if u == us:
                hop = src
            else:
                hop = members[pos % len(members)]          # the same local index: its rail
                net[(src, hop)] = net.get((src, hop), 0.0) + nbytes * p_unit[u]
            for dst in members:
                if dst != hop:
                    nvl[(hop, dst)] = nvl.get((hop, dst), 0.0) + nbytes * p_rank[dst]
    return net, nvl


def plan_moe_dispatch(G, ranks: list, nbytes: int, routing: tuple):
    """The CollectivePlan of one dispatch (or combine) over `ranks` (GPU names, expert-parallel
    order): one phase of the network and NVLink flows, NCCL's latency of one network and one NVLink
    step."""
    from sim.network.collectives import CollectivePlan, Phase, _cache

    backend = routing[0]
    if backend not in BACKENDS:
        raise ConfigError(f"dispatcher backend {backend!r} must be one of {', '.join(BACKENDS)}",
                          key="moe_flex_dispatcher_backend")
    cache = _cache(G)
    lay = cache.layout(list(ranks))
    units = units_of(G, list(ranks), backend)
    if backend == "deepep" and len(units) > lay.n_servers:
        raise ConfigError("the deepep dispatcher forwards over NVLink only inside a server and these "
                          f"{len(ranks)} expert-parallel ranks span servers of one NVLink domain: use "
                          "moe_flex_dispatcher_backend: hybridep (Megatron-Core: only hybridep supports "
                          "multi-node NVLink)", key="training.moe_flex_dispatcher_backend")
    if len(ranks) < 2 or nbytes == 0:
        return CollectivePlan("moe_dispatch", backend, "Simple", list(ranks), int(nbytes), len(units), 0, 1.0,
                              [], routing)
    net, nvl = dispatch_flows(G, list(ranks), int(nbytes), routing)
    router = cache.router
    nodes = G.nodes
    ph = Phase()
    for (a, b), by in net.items():
        ph.add(router.path(a, b, rail=nodes[a]["rail"], dst_rail=nodes[b]["rail"]), by, f"dispatch net:{a}->{b}")
    for (a, b), by in nvl.items():
        ph.add(router.path(a, b), by, f"dispatch nvl:{a}->{b}")
    spec = G.graph["topology"].collectives
    lat = spec.base_latency_us["ring"]["Simple"] + spec.step_latency_us[lay.intra_class]["ring"]["Simple"]
    if len(units) > 1:
        lat += spec.step_latency_us["net"]["ring"]["Simple"]
    return CollectivePlan("moe_dispatch", backend, "Simple", list(ranks), int(nbytes), len(units),
                          int(round(lat * 1e3)), 1.0, [ph], routing)

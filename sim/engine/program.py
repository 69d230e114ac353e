"""Workload expansion: a scenario's pipeline schedule becomes per-rank engine programs.

Each schedule action (F, B, I, W of a virtual stage on a microbatch) expands into the kernels of
the stage's layers, timed by a cost model, and the communication each parallel dimension adds
(Megatron-LM's placement of collectives). What each dimension adds, with its sources, is one
module of sim.engine.parallel (tp, cp, ep, pp, dp, fsdp, fp8); this module composes them:

- a forward layer (`_forward_layer`): TP gather, attention (CP's exchange inside its core), TP
  reduce, TP gather, EP dispatch, expert-TP gather, MLP, expert-TP reduce-scatter, EP combine,
  TP reduce;
- a backward layer (`_backward_layer`): the recompute (`full` re-runs the layer's forward with
  its TP collectives, a group's layers before the backward of its last, none for a layer the
  block method leaves unchecked; `selective-op` torchtitan's unsaved ops with the all-gathers or
  all-reduces, `selective` its recompute_modules: the core attention by default, the
  dense MLP and shared experts with their TP collectives, the MoE layer with its dispatch and
  combine), then the MLP block and the attention
  block in reverse, each: the TP output-gradient gather, the input gradient, the TP reduction
  (or the async column-parallel backward), the weight gradient; EP's combine-grad before the
  MLP, dispatch-grad after it;
- a pipeline action (`_forward_action`, `_backward_action`): PP's receive, the embedding on the
  first stage, each layer (wrapped by FSDP's gathers and, on the last backward, DP's
  per-layer gradient reduction), FP8's amax all-reduce after the layers, the MTP modules and
  the head on the loss stage, PP's send;
  DualPipe's F&B pairs interleaved;
- the step (`_program`): the ZeRO parameter gathers launched at its start, the actions in
  schedule order, then DP's gradient reduction, the tied-embedding all-reduce, the optimizer
  step and ZeRO-1/2's parameter all-gather.
Every simulated rank (representative: one per pipeline rank, the tp = cp = dp = 0 member;
all: every GPU) gets its own program; groups and pipeline peers are the rank's own.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.engine.core import Block, Compute, Mark, Template, Wait, expand_blocks
from sim.engine.parallel.cp import ContextParallel, cp_bytes
from sim.engine.parallel.dp import DataParallel
from sim.engine.parallel.ep import ExpertParallel
from sim.engine.parallel.fp8 import Fp8AmaxReduction
from sim.engine.parallel.fsdp import ShardedDataParallel
from sim.engine.parallel.groups import Groups
from sim.engine.parallel.pp import PipelineParallel, overlap_pair
from sim.engine.parallel.tp import TensorParallel, pair_tp_waits
from sim.layout import Layout

__all__ = ["CostModel", "LayerCost", "ProgramBuilder", "cp_bytes", "overlap_pair", "pair_tp_waits"]


@dataclass(frozen=True)
class LayerCost:
    """Compute time (ns) of one layer's attention and MLP blocks for one microbatch on one GPU,
    per phase: fwd, dgrad (input gradient), wgrad (weight gradient), recompute (the extra
    forward work the recompute policy re-runs in the backward).

    `attn_core` (needed with context parallelism): the core attention's part of `attn`, keys
    fwd, dgrad (whole core attention of the rank, all ring steps), pre_fwd, pre_dgrad (the
    ops before it: norm, QKV projection, RoPE; the rest of the block, out_proj and
    bias-dropout-add, is after it), correction_fwd / correction_bwd (one ring step's
    online-softmax output correction / dQ-dK-dV accumulation, memory-bound).
    `expert` (MoE layers): the routed-expert GEMMs' part of `mlp`, per phase (fwd, dgrad,
    wgrad), scaled by the routing imbalance. `shared` (MoE layers with
    training.moe_shared_expert_overlap): the shared experts' part of `mlp`, {"fc1": {phase: ns},
    "fc2": ...}, which runs under the dispatcher's all-to-alls (sim.engine.parallel.ep)."""

    attn: dict
    mlp: dict
    attn_core: dict | None = None
    expert: dict | None = None
    shared: dict | None = None


class CostModel:
    """What program expansion needs from the compute model (see sim.engine.costs)."""

    def layer(self, layer: int) -> LayerCost:  # pragma: no cover - interface
        raise NotImplementedError

    def embedding_ns(self, phase: str) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def head_ns(self, phase: str) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def mtp_ns(self, phase: str) -> int:  # pragma: no cover - interface
        """One multi-token prediction module's ops before its transformer layer."""
        raise NotImplementedError

    def optimizer_ns(self, n_params: float) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def fp8_gemms(self, layer: int) -> int:
        """Transformer Engine GEMMs of a decoder layer that run with FP8 delayed scaling (each
        expert's its own), whose amaxes the autocast region reduces (sim.engine.parallel.fp8);
        0 unless the precision is fp8 with delayed scaling."""
        return 0


def _act_bytes(sc) -> int:
    """Bytes of one microbatch's hidden states (s/cp x b x h) at the training precision."""
    p = 4 if sc.training.precision == "fp32" else 2
    return (sc.training.seq_length // sc.parallelism.cp) * sc.training.micro_batch_size * sc.model.hidden_size * p


class _Microbatch:
    """Stands for the microbatch number while a layer's instructions are made once as a template
    (`ProgramBuilder._layer`): formats as a NUL, which each instance replaces by its number."""

    def __format__(self, spec: str) -> str:
        return "\x00"

    __str__ = __repr__ = lambda self: "\x00"


_MB = _Microbatch()



class ProgramBuilder(Groups, TensorParallel, ContextParallel, ExpertParallel, PipelineParallel,
                     DataParallel, ShardedDataParallel, Fp8AmaxReduction):
    """Builds the per-rank programs of one scenario (representative ranks: one per pipeline
    rank; the TP, CP and DP peers of a rank do the same work at the same time). The dimensions'
    parts are the mixins of sim.engine.parallel; the composition is here."""

    def __init__(self, sc, schedule, costs: CostModel, layout: Layout | None = None, *,
                 ranks: str | None = None, recipes: bool = False, blocks: bool = False):
        self.sc = sc
        self.sched = schedule
        self.costs = costs
        self.layout = layout or Layout.from_scenario(sc)
        self.mode = ranks or sc.simulation.ranks
        self.me = self.layout.rank(pp=0)
        self.reps = {r: self.layout.rank(pp=r) for r in range(sc.parallelism.pp)}
        self._groups: dict = {}
        self._recompute_group = {layer: g for g in sc.derived.recompute_groups for layer in g}
        """Under full recompute, each recomputed layer's checkpoint group."""
        self._peers: dict = {}
        self._costs: dict = {}
        self._specs: dict = {}
        self.blocks = blocks
        """Emit an instance of a simple template (core.Template.simple) as one Block."""
        self.actions = True
        """Make a pipeline action's instructions (its layers and ends) from one template where
        it can (not with FSDP's per-layer gathers, nor for a stage's last backward launching each
        layer's gradient reduction); False: a template per layer (tests compare the two)."""
        self.recipes: dict | None = {} if recipes else None
        """With `recipes=True`: (rank, spec) -> how each rank of its stage makes its own version
        (Groups._recipe, sim.engine.symmetry)."""
        self.act_bytes = _act_bytes(sc)
        p = sc.parallelism
        self.sp = p.sequence_parallel and p.tp > 1
        self.cp_bytes = cp_bytes(sc)
        self.imbalance = sc.derived.moe_expert_load   # routing imbalance, capped / padded by capacity
        self.zero3 = p.zero_stage >= 3 and (p.dp * p.cp > 1 or p.edp > 1)
        self.params_per_stage = self._params_per_stage()
        self.end_split = self._end_params()
        self.end_params = {s: 0.0 + emb + head + mtp for s, (emb, head, mtp) in self.end_split.items()}
        from sim.memory import stage_activation_bytes
        self.stage_act = stage_activation_bytes(sc)

    # -- static facts --------------------------------------------------------------------
    def _params_per_stage(self) -> dict:
        """Parameters per GPU of each virtual stage (dense and routed experts separately)."""
        from sim.memory import layer_params_per_gpu

        sc, d, p = self.sc, self.sc.derived, self.sc.parallelism
        out = {}
        for s in range(d.num_virtual_stages):
            out[s] = [layer_params_per_gpu(sc.model, p, layer) for layer in d.stage_layers(s)]
        return out

    def _end_params(self) -> dict:
        """Parameters per GPU of the embedding, the LM head and the MTP modules' ends a virtual
        stage holds, {stage: (embedding, head, mtp)} (reduced and updated with the stage's
        layers)."""
        from sim import workload
        from sim.memory import tp_share

        sc, d, p = self.sc, self.sc.derived, self.sc.parallelism
        out = {}
        for s in range(d.num_virtual_stages):
            emb = head = mtp = 0.0
            if s in d.embedding_stages:
                emb = tp_share(workload.embedding_params(sc.model), p.tp)
            if s in d.loss_stages:
                holds_emb = any(d.stage_rank[x] == d.stage_rank[s] for x in d.embedding_stages)
                head = tp_share(workload.output_params(sc.model, include_tied_copy=not holds_emb), p.tp)
                mtp = tp_share(workload.mtp_params(sc.model, include_embedding_copy=not holds_emb), p.tp)
            out[s] = (emb, head, mtp)
        return out

    def _layers(self, stage: int) -> range:
        """The stage's transformer layers: decoder layers, then on a loss stage the MTP
        modules' (Derived.stage_layers)."""
        return self.sc.derived.stage_layers(stage)

    def _cost(self, layer: int) -> LayerCost:
        c = self._costs.get(layer)     # the cost model is a pure function of the layer
        if c is None:
            c = self._costs[layer] = self.costs.layer(layer)
            if self.sc.parallelism.cp > 1 and c.attn_core is None:
                raise TypeError("context parallelism needs LayerCost.attn_core from the cost model")
        return c

    # -- a layer -------------------------------------------------------------------------
    def _forward_layer(self, prog, r, layer, mb, tag="F"):
        c = self._cost(layer)
        ag, rs = ("all_gather", "reduce_scatter") if self.sp else (None, "all_reduce")
        if ag:
            self._tp(prog, r, f"{tag} L{layer} attn all-gather mb{mb}", ag)
        self._attn_forward(prog, r, layer, mb, c, tag)
        self._tp(prog, r, f"{tag} L{layer} attn {rs} mb{mb}", rs)
        tp_mlp = self._tp_mlp(layer)
        if ag and tp_mlp:
            self._tp(prog, r, f"{tag} L{layer} mlp all-gather mb{mb}", ag)
        cat = "recompute" if tag == "R" else "compute"
        shared = c.shared
        self._a2a(prog, r, layer, f"{tag} L{layer} dispatch mb{mb}", "dispatch",
                  shared and (shared["fc1"]["fwd"], f"{tag} L{layer} mlp shared fc1 mb{mb}", cat))
        self._etp(prog, r, layer, f"{tag} L{layer} expert all-gather mb{mb}", "all_gather")
        prog.append(Compute(self._mlp_ns(c, layer, "fwd"), f"{tag} L{layer} mlp mb{mb}", cat))
        self._etp(prog, r, layer, f"{tag} L{layer} expert reduce-scatter mb{mb}", "reduce_scatter")
        self._a2a(prog, r, layer, f"{tag} L{layer} combine mb{mb}", "combine",
                  shared and (shared["fc2"]["fwd"], f"{tag} L{layer} mlp shared fc2 mb{mb}", cat))
        if tp_mlp:
            self._tp(prog, r, f"{tag} L{layer} mlp {rs} mb{mb}", rs)

    def _dgrad(self, prog, r, layer, mb, block, c, lc, ik, name, hold_back: int = 0):
        """The block's input gradient; `hold_back` ns of its end (the column GEMM's dgrad, which
        the async backward runs itself) are left out."""
        if block == "attn" and self.sc.parallelism.cp > 1:
            self._attn_dgrad(prog, r, layer, mb, c, lc, ik, name, hold_back)
        else:
            prog.append(Compute((self._mlp_ns(lc, layer, "dgrad") if block == "mlp" else c["dgrad"])
                                - hold_back, f"{ik} {name} dgrad"))

    def _mlp_recompute(self, prog, r, layer, mb, name, c):
        """The MLP block's selective recompute (recompute_modules layernorm on MoE layers, mlp, moe,
        moe_act, shared_experts), each module's forward re-run whole as Megatron-Core's
        checkpoints do: the dense MLP and the shared experts with their TP collectives, the MoE
        layer (moe) with its TP gather, dispatch, expert-TP collectives, combine and TP
        reduction, as the forward (`_forward_layer`). The routed-expert part is scaled by the
        routing imbalance as the forward's (_mlp_ns)."""
        ns = c["recompute"]
        if self.imbalance != 1.0 and c.get("recompute_expert"):
            ns += int(round((self.imbalance - 1.0) * c["recompute_expert"]))
        ag, rs = ("all_gather", "reduce_scatter") if self.sp else (None, "all_reduce")
        moe = self.sc.model.is_moe_layer(layer) and "moe" in self.sc.training.recompute_modules
        tp = (moe or c.get("recompute_tp")) and self._tp_mlp(layer)
        if tp and ag:
            self._tp(prog, r, f"R L{layer} mlp all-gather mb{mb}", ag)
        if moe:
            self._a2a(prog, r, layer, f"R L{layer} dispatch mb{mb}", "dispatch")
            self._etp(prog, r, layer, f"R L{layer} expert all-gather mb{mb}", "all_gather")
        prog.append(Compute(ns, f"R {name}", "recompute"))
        if moe:
            self._etp(prog, r, layer, f"R L{layer} expert reduce-scatter mb{mb}", "reduce_scatter")
            self._a2a(prog, r, layer, f"R L{layer} combine mb{mb}")
        if tp:
            self._tp(prog, r, f"R L{layer} mlp {rs} mb{mb}", rs)

    def _backward_block(self, prog, r, layer, mb, block, c, do_input, do_weight, lc):
        name = f"L{layer} {block} mb{mb}"
        ik, wk = ("B", "B") if (do_input and do_weight) else ("I", "W")  # a full B or split I / W
        rec = self.sc.training.recompute
        if do_input:
            if rec == "selective" and block == "attn" and c["recompute"]:
                if self.sc.parallelism.cp > 1:
                    if c.get("recompute_pre"):
                        # recompute_modules layernorm / mla_up_proj: before the core attention
                        prog.append(Compute(c["recompute_pre"], f"R {name}", "recompute"))
                    if "core_attn" in self.sc.training.recompute_modules:
                        # the core attention re-run includes its CP exchange (ring or all-to-all)
                        self._cp_core_forward(prog, r, layer, mb, lc.attn_core, "R", "recompute")
                else:
                    prog.append(Compute(c["recompute"], f"R {name}", "recompute"))
            elif rec == "selective" and block == "mlp" and c["recompute"]:
                self._mlp_recompute(prog, r, layer, mb, name, c)
            tp = block == "attn" or self._tp_mlp(layer)
            if block == "mlp":
                # etp != tp: the backward of the combine's reduce-scatter
                self._etp(prog, r, layer, f"B {name} expert grad all-gather", "all_gather")
            if self.sp and tp:
                # the backward of the forward's closing reduce-scatter (Korthikanti et al. 2022,
                # sec. 4.2.2: g-bar, reduce-scatter forward / all-gather backward): the output
                # gradient is gathered over the sequence before the block's input gradient
                self._tp(prog, r, f"B {name} output-grad all-gather", "all_gather")
            if tp and do_weight and self._async_bwd(c):
                self._async_column_backward(prog, r, layer, mb, block, c, lc, name)
                return
            if self.sp:
                # re-gather the block input for the column-parallel linear's wgrad (Megatron-LM
                # saves the sequence shard); an MoE block's experts keep their permuted inputs
                if do_weight and tp and not (block == "mlp" and self.sc.model.is_moe_layer(layer)):
                    self._tp(prog, r, f"B {name} input all-gather", "all_gather")
                self._dgrad(prog, r, layer, mb, block, c, lc, ik, name)
                if tp:
                    self._tp(prog, r, f"B {name} grad reduce-scatter", "reduce_scatter")
            else:
                self._dgrad(prog, r, layer, mb, block, c, lc, ik, name)
                if tp:
                    self._tp(prog, r, f"B {name} grad all-reduce", "all_reduce")
            if block == "mlp":
                # etp != tp: the backward of the dispatch's all-gather
                self._etp(prog, r, layer, f"B {name} expert grad reduce-scatter", "reduce_scatter")
        if do_weight:
            prog.append(Compute(self._mlp_ns(lc, layer, "wgrad", shared_out=do_input) if block == "mlp"
                                else c["wgrad"], f"{wk} {name} wgrad"))

    @staticmethod
    def _shared_grad(c, layer, mb, part, do_weight):
        """The shared experts' `part` (fc1, fc2) of an input-gradient backward that runs under
        the all-to-all's gradient (`_a2a`'s `under`; sim.engine.parallel.ep): its input gradient,
        and with `do_weight` (a full backward) its weight gradient too; None without the overlap."""
        shared = c.shared
        if shared is None:
            return None
        ns = shared[part]["dgrad"] + (shared[part]["wgrad"] if do_weight else 0)
        return ns, f"{'B' if do_weight else 'I'} L{layer} mlp shared {part} mb{mb}", "compute"

    def _op_sac_recompute(self, prog, r, layer, mb, c):
        """torchtitan's per-op selective checkpointing (recompute selective-op): the first
        saved tensor its backward unpacks re-runs the block's forward whole, each saved op's
        output taken from the cache (c.attn / c.mlp "recompute": the rest of the ops). The
        all-gathers before the attention and the MLP (SP) run again, not being saved, as do the
        all-reduces after them (TP without SP); the reduce-scatters' outputs are saved."""
        for block, cost in (("attn", c.attn), ("mlp", c.mlp)):
            if self.sp:
                self._tp(prog, r, f"R L{layer} {block} all-gather mb{mb}", "all_gather")
            prog.append(Compute(cost["recompute"], f"R L{layer} {block} mb{mb}", "recompute"))
            if not self.sp:
                self._tp(prog, r, f"R L{layer} {block} all_reduce mb{mb}", "all_reduce")

    def _backward_layer(self, prog, r, layer, mb, do_input, do_weight):
        c = self._cost(layer)
        if do_input and self.sc.training.recompute == "full":
            # the group checkpointed with this layer (Derived.recompute_groups) is re-run whole
            # before the backward of its last layer, the first the backward reaches
            group = self._recompute_group.get(layer, ())
            if group and layer == group[-1]:
                for g in group:
                    self._forward_layer(prog, r, g, mb, tag="R")
        elif do_input and self.sc.training.recompute == "selective-op":
            self._op_sac_recompute(prog, r, layer, mb, c)
        if do_input:
            self._a2a(prog, r, layer, f"B L{layer} combine-grad mb{mb}", "combine-grad",
                      self._shared_grad(c, layer, mb, "fc2", do_weight))
        self._backward_block(prog, r, layer, mb, "mlp", c.mlp, do_input, do_weight, c)
        if do_input:
            self._a2a(prog, r, layer, f"B L{layer} dispatch-grad mb{mb}", "dispatch-grad",
                      self._shared_grad(c, layer, mb, "fc1", do_weight))
        self._backward_block(prog, r, layer, mb, "attn", c.attn, do_input, do_weight, c)

    # -- pipeline actions ----------------------------------------------------------------
    def _forward_action(self, prog, r, s, mb, first, last, each_layer=None):
        """A forward action's own instructions (without its receive and send): the embedding on
        the first stage, each layer, the head and loss on the last, and the activations it keeps.
        `each_layer(k, layer)`: what makes the k-th layer's (default: its instructions here)."""
        if first:
            prog.append(Compute(self.costs.embedding_ns("fwd"), f"F embedding mb{mb}"))
        for k, layer in enumerate(self._layers(s)):
            if layer >= self.sc.model.num_layers:
                self._mtp_forward(prog, r, layer, mb)
            if each_layer is None:
                self._forward_layer(prog, r, layer, mb)
            else:
                each_layer(k, layer)
        self._fp8_amax_reduce(prog, r, s, mb, "fwd")       # the autocast region's exit
        if last:
            prog.append(Compute(self.costs.head_ns("fwd"), f"F head+loss mb{mb}"))
            for k in range(self.sc.model.mtp_num_layers):
                prog.append(Compute(self.costs.head_ns("fwd"), f"F mtp{k} head+loss mb{mb}"))
        prog.append(Mark(f"{s}F{mb}", "activations", self.stage_act[s]))

    def _backward_action(self, prog, r, s, mb, kind, first, last, each_layer=None, after=None):
        """A backward action's own instructions (B: input and weight gradients, I: input, W:
        weight), the layers in reverse between the head's and the embedding's, and the
        activations it frees. `each_layer(k, layer)` as for `_forward_action` (k counts in
        reverse order); `after()` adds what goes before the activations are freed."""
        do_input, do_weight = kind in ("B", "I"), kind in ("B", "W")
        heads = 1 + self.sc.model.mtp_num_layers
        if do_input and last:
            for k in range(heads):
                prog.append(Compute(self.costs.head_ns("dgrad"), f"I head mb{mb}" if k == 0 else
                                    f"I mtp{k - 1} head mb{mb}"))
        if do_weight and last:
            for k in range(heads):
                prog.append(Compute(self.costs.head_ns("wgrad"), f"W head mb{mb}" if k == 0 else
                                    f"W mtp{k - 1} head mb{mb}"))
        for k, layer in enumerate(reversed(self._layers(s))):
            if each_layer is None:
                self._backward_layer(prog, r, layer, mb, do_input, do_weight)
            else:
                each_layer(k, layer)
            if layer >= self.sc.model.num_layers:
                self._mtp_backward(prog, r, layer, mb, do_input, do_weight)
        if do_input:
            self._fp8_amax_reduce(prog, r, s, mb, "bwd")   # in the region's first module's backward
        if do_weight and first:
            prog.append(Compute(self.costs.embedding_ns("wgrad"), f"W embedding mb{mb}"))
        if after is not None:
            after()
        if do_input:
            prog.append(Mark(f"{s}{kind}{mb}", "activations", -self.stage_act[s]))

    # -- instructions from templates -----------------------------------------------------
    def _layer(self, prog, key, make, mb):
        """Append a pipeline action's (or one layer's) instructions for microbatch `mb`. They
        differ between microbatches only in the number in their names (and the handles of their
        own launches), so they are made once per `key` (`make(list, microbatch)` with a stand-in
        number) as a Template and instanced: a large step repeats each action for hundreds of
        microbatches. With `blocks`, an instance of a simple template (see Template) is one Block."""
        hit = self._templates.get(key)
        if hit is None:
            tmp: list = []
            before = len(self._pending_tp)
            make(tmp, _MB)
            pending = tuple(self._pending_tp[before:])
            del self._pending_tp[before:]
            template = Template(tmp)
            hit = self._templates[key] = (template, pending,
                                          self.blocks and not pending and template.simple)
        template, pending, whole = hit
        self._serial += 1
        n = self._serial
        if whole:
            prog.append(Block(template, str(mb), n))
            return
        prog += template.expand(mb, n)
        self._pending_tp.extend((h, n) for h in pending)

    # -- the program ---------------------------------------------------------------------
    def build(self) -> dict:
        """{global rank: program} for the simulated ranks."""
        if self.mode == "all":
            ranks = range(self.layout.world_size)
        else:
            ranks = [self.reps[r] for r in range(self.sc.parallelism.pp)]
        return {g: self.program_of(g) for g in ranks}

    def program_of(self, g: int) -> list:
        """The step's program of global rank `g` (whichever ranks the builder simulates; the
        trace's slice arguments build a traced rank's again, sim.engine.slice_args)."""
        self.me = g
        return self._program(self.layout.coord(g).pp)


    def reset_rank_state(self) -> None:
        """The state the layer methods keep while one rank is built (pending TP waits, FSDP's
        gathered units, the rank's layer templates); sim.sweep.bound uses the layer methods too."""
        self._pending_tp: list = []
        self._fsdp: dict = {}
        self._zero12_first: set = set()  # ZeRO 1/2's chunks gathered a layer ahead in their first forward
        self._zero12_units: dict = {}
        self._templates: dict = {}       # one rank's layer templates (its groups are in them)
        self._serial = 0

    def _program(self, r) -> list:
        """The step's program of the rank being built (`self.me`, pipeline rank r)."""
        sched = self.sched
        prog: list = []
        self.reset_rank_state()
        stages = sched.rank_stages(r)
        # parameter gathers launched at the start: FSDP's root unit, ZeRO 1/2's overlapped gather
        self._gathers = {**self._fsdp_root_gathers(prog, stages), **self._zero12_gathers_at_start(prog, stages)}
        self._per_mb = self.sc.parallelism.grad_reduce == "microbatch"  # every backward reduces its layers
        self._grad_handles: list = []     # their launches (overlap_grad_reduce), waited at the end
        items = [a for item in sched.ranks[r] for a in item.parts]
        self._last_backward = {}   # stage -> index in the rank's list of the last I/B of that stage
        for i, a in enumerate(items):
            if a.kind in ("B", "W") or (a.kind == "I" and not any(
                    b.kind == "W" and b.stage == a.stage for b in items)):
                self._last_backward[a.stage] = i
        self._split_bw = {s: any(b.kind == "W" and b.stage == s for b in items) for s in stages}
        # DualPipe's overlapped F&B pairs: (index of the F part, index of the B part) in `items`
        pairs, n = [], 0
        for item in sched.ranks[r]:
            if len(item.parts) == 2:
                pairs.append((n, n + 1))
            n += len(item.parts)
        bounds = {}
        for i, a in enumerate(items):
            bounds[i] = len(prog)
            if a.kind == "F":
                self._forward_item(prog, r, a)
            else:
                self._backward_item(prog, r, i, a)
            if self._pending_tp:
                prog[bounds[i]:] = pair_tp_waits(expand_blocks(prog[bounds[i]:]), set(self._pending_tp))
                self._pending_tp.clear()
        bounds[len(items)] = len(prog)
        self._overlap_pairs(prog, r, pairs, bounds)
        self._step_grad_reduction(prog, r, stages, self._per_mb, self._grad_handles)
        self._tied_embedding_reduce(prog, r)
        self._optimizer(prog, stages)
        return prog

    def _forward_item(self, prog, r, a):
        """One forward action: the wait for its chunk's parameter gather (first forward), the
        receive, the stage's instructions (one template, or per layer with FSDP), the send."""
        s, mb = a.stage, a.microbatch
        for h in self._gathers.pop(s, ()):
            prog.append(Wait(h, f"param gather chunk {s}"))
        self._fsdp_before_receive(prog, r, s, backward=False)
        self._recv_input(prog, r, s, mb, "F")
        first, last = self._is_first(s, mb), self._is_last(s, mb)
        gather = s in self._zero12_first        # ZeRO 1/2's gathers one layer ahead (dp.py)
        self._zero12_first.discard(s)
        if self.actions and not (self.zero3 or gather):
            # the whole action from one template (its layers and ends; see _layer)
            self._layer(prog, ("F", s, first, last),
                        lambda out, m: self._forward_action(out, r, s, m, first, last), mb)
        else:                           # per layer (FSDP: a gather around each)
            layers = list(self._layers(s))
            if gather:
                self._zero12_before(prog, s, layers, -1)

            def fwd_layer(k, layer):
                self._fsdp_before(prog, r, s, layers, k)
                if gather:
                    self._zero12_before(prog, s, layers, k)
                self._layer(prog, ("F", layer), lambda out, m: self._forward_layer(out, r, layer, m), mb)
                if self.sc.parallelism.reshard_after_forward:
                    self._fsdp_reshard(s, layer)
                if gather and k == len(layers) - 1:
                    self._zero12_before(prog, s, layers, len(layers))

            if gather and not layers:
                self._zero12_before(prog, s, layers, 0)

            self._forward_action(prog, r, s, mb, first, last, fwd_layer)
        self._send_output(prog, r, s, mb, "F")

    def _backward_item(self, prog, r, i, a):
        """One backward action (B, I or W; the i-th of the rank): the receive, the stage's
        instructions (one template; per layer with FSDP or where the action launches each
        layer's gradient reduction), the send."""
        s, mb = a.stage, a.microbatch
        do_input, do_weight = a.kind in ("B", "I"), a.kind in ("B", "W")
        per_mb = self._per_mb
        if do_input:
            self._fsdp_before_receive(prog, r, s, backward=True)
            self._recv_input(prog, r, s, mb, a.kind)
        first, last = self._is_first(s, mb), self._is_last(s, mb)
        # the last backward of a stage (every backward with grad_reduce: microbatch)
        # launches each layer's gradient reduction, after the layer's weight gradient
        final = ((per_mb or i == self._last_backward.get(s)) and (do_weight or not self._split_bw[s])
                 and (self.sc.training.overlap_grad_reduce or per_mb))
        if self.actions and not (self.zero3 or final):
            self._layer(prog, ("B", s, a.kind, first, last),
                        lambda out, m: self._backward_action(out, r, s, m, a.kind, first, last), mb)
        else:                           # per layer (FSDP; each layer's gradient reduction)
            layers = list(reversed(self._layers(s)))

            # FSDP2 reshards after the backward; under grad_reduce step (torch.distributed.pipelining)
            # only after the stage's last one (fsdp.py)
            reshard = do_input and (per_mb or i == self._last_backward.get(s))

            def bwd_layer(k, layer):
                if do_input:
                    self._fsdp_before(prog, r, s, layers, k)
                self._layer(prog, ("B", layer, do_input, do_weight),
                            lambda out, m: self._backward_layer(out, r, layer, m, do_input, do_weight), mb)
                if reshard:
                    self._fsdp_reshard(s, layer)
                if final:
                    self._reduce_layer_grads(prog, r, s, layer, mb, per_mb, self._grad_handles)

            def ends_reduction():
                if final:
                    self._reduce_end_grads(prog, r, s, mb, per_mb, self._grad_handles)

            self._backward_action(prog, r, s, mb, a.kind, first, last, bwd_layer, ends_reduction)
        if do_input:
            self._send_output(prog, r, s, mb, a.kind)

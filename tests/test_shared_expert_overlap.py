"""The shared experts under the dispatcher's all-to-alls (`training.moe_shared_expert_overlap`,
Megatron-Core's --moe-shared-expert-overlap; issue #30): each all-to-all whose shared part runs
under it costs max(all-to-all, shared part) instead of their sum, so the step is shorter by
exactly the sum of min(all-to-all, shared part) over every dispatch, combine and their gradients
(a one-stage step: nothing else overlaps); no compute is added or lost, the weight gradients
included where the schedule splits them off; Megatron-Core's rules; the flag's round trip."""

from __future__ import annotations

import pytest

from conftest import REPO, base_scenario, run_cli
from sim.config import build_scenario, load_scenario
from sim.engine.costs import DeviceCostModel
from sim.engine.simulate import simulate
from sim.errors import ConfigError


def _scenario(on: bool, dispatcher: str = "alltoall", model: dict | None = None, training: dict | None = None,
              **parallel):
    data = base_scenario(
        model={"num_layers": 2, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 1024,
               "num_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 256, "moe_shared_experts": 1,
               **(model or {})},
        cluster={"topology": "dgx-h100-ndr"},
        parallelism={"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "data_parallel_size": 2,
                     "expert_model_parallel_size": 2, **parallel},
        training={"seq_length": 256, "micro_batch_size": 1, "global_batch_size": 4, "overlap_grad_reduce": False,
                  "moe_token_dispatcher": dispatcher, "moe_shared_expert_overlap": on, **(training or {})},
        simulation={"network": "analytical"})
    return build_scenario(data)


def _compute_ns(res, rank: int) -> int:
    return sum(r.end_ns - r.start_ns for r in res.records
               if r.rank == rank and r.stream == "compute" and not r.cat.startswith("comm:"))


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
def test_the_step_is_shorter_by_the_shared_work_each_all_to_all_hides(dispatcher):
    """One stage, two EP ranks, two layers, two microbatches: the saving is, over every token
    all-to-all of the step without the overlap (its record's duration d), min(d, s) with s the
    shared part the cost model puts under it (fc1 + activation under the dispatch and the
    dispatch's gradient, fc2 under the combine and the combine's gradient; a full backward's
    weight gradients with its input gradients); the shared part starts with the all-to-all."""
    off, on = simulate(_scenario(False, dispatcher)), simulate(_scenario(True, dispatcher))
    costs = DeviceCostModel(_scenario(True, dispatcher))
    ends = {r.name: r for r in off.records if r.rank == 0}
    saved = 0
    for layer in range(2):
        s = costs.layer(layer).shared
        assert s["fc1"]["fwd"] > 0 and s["fc2"]["fwd"] > 0
        for mb in range(2):
            for name, under in ((f"F L{layer} dispatch mb{mb}", s["fc1"]["fwd"]),
                                (f"F L{layer} combine mb{mb}", s["fc2"]["fwd"]),
                                (f"B L{layer} combine-grad mb{mb}", s["fc2"]["dgrad"] + s["fc2"]["wgrad"]),
                                (f"B L{layer} dispatch-grad mb{mb}", s["fc1"]["dgrad"] + s["fc1"]["wgrad"])):
                saved += min(ends[name].end_ns - ends[name].start_ns, under)
    assert saved > 0 and off.makespan_ns - on.makespan_ns == saved
    assert _compute_ns(on, 0) == _compute_ns(off, 0)
    mine = {r.name: r for r in on.records if r.rank == 0}
    a2a, shared = mine["F L0 dispatch mb0"], mine["F L0 mlp shared fc1 mb0"]
    assert shared.stream == "compute" and shared.start_ns == a2a.start_ns
    assert shared.end_ns - shared.start_ns == costs.layer(0).shared["fc1"]["fwd"]
    after = mine["F L0 dispatch mb0 probs" if dispatcher == "alltoall" else "F L0 mlp mb0"]   # what follows both
    assert after.start_ns == max(a2a.end_ns, shared.end_ns)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_no_compute_is_added_or_lost_with_pipelines_and_split_weight_gradients(schedule):
    """Two stages under 1F1B and ZB-H1 (whose W actions keep the shared experts' weight
    gradients): each stage's compute is the same with the overlap as without, and the step is
    shorter."""
    off = simulate(_scenario(False, pipeline_model_parallel_size=2, pipeline_schedule=schedule))
    on = simulate(_scenario(True, pipeline_model_parallel_size=2, pipeline_schedule=schedule))
    for rank in on.simulated_ranks:
        assert _compute_ns(on, rank) == _compute_ns(off, rank)
    assert on.makespan_ns < off.makespan_ns
    if schedule == "zb-h1":        # the shared parts under the gradients' all-to-alls are input gradients only
        names = {r.name.split(" mb")[0] for r in on.records if "shared" in r.name}
        assert {"I L1 mlp shared fc2", "I L1 mlp shared fc1"} <= names and not any(n[0] == "B" for n in names)


def test_a_full_recompute_overlaps_as_the_forward_does():
    """recompute full re-runs each layer's forward whole, the shared experts under the
    all-to-alls again (category recompute), with the step still shorter than without."""
    on = simulate(_scenario(True, training={"recompute": "full"}))
    off = simulate(_scenario(False, training={"recompute": "full"}))
    again = [r for r in on.records if r.name.startswith("R ") and "shared fc1" in r.name]
    assert again and all(r.cat == "recompute" for r in again)
    assert on.makespan_ns < off.makespan_ns and _compute_ns(on, 0) == _compute_ns(off, 0)


@pytest.mark.parametrize("change,words", [
    ({"model": {"moe_shared_experts": 0}}, ["needs shared experts", "moe_shared_experts = 0"]),
    ({"parallel": {"expert_model_parallel_size": 1}}, ["expert_model_parallel_size > 1"]),
    ({"training": {"overlap_moe_expert_parallel_comm": True}}, ["disable moe_shared_expert_overlap"]),
    ({"training": {"recompute": "selective", "recompute_modules": ["shared_experts"]}},
     ["shared_experts recompute cannot work"]),
    ({"parallel": {"pipeline_model_parallel_size": 2, "pipeline_schedule": "dualpipev"}}, ["dualpipev", "overlapped pair"]),
])
def test_megatron_cores_rules(change, words):
    data = base_scenario(
        model={"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 1024,
               "num_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 256, "moe_shared_experts": 1,
               **change.get("model", {})},
        cluster={"topology": "dgx-h100-ndr"},
        parallelism={"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "data_parallel_size": 2,
                     "expert_model_parallel_size": 2, **change.get("parallel", {})},
        training={"seq_length": 256, "micro_batch_size": 1, "global_batch_size": 8,
                  "moe_shared_expert_overlap": True, **change.get("training", {})})
    with pytest.raises(ConfigError) as e:
        build_scenario(data)
    assert e.value.key == "training.moe_shared_expert_overlap" and all(w in str(e.value) for w in words), str(e.value)


def test_the_cli_refuses_it_on_a_model_without_shared_experts():
    code, _, err = run_cli("run", "mixtral-8x7b-h200x16-dualpipev", "--set", "parallelism.pipeline_schedule=1f1b",
                           "--set", "training.moe_shared_expert_overlap=true")
    assert code == 2 and "training.moe_shared_expert_overlap" in err and "Traceback" not in err


@pytest.mark.parametrize("fmt", ["megatron", "bridge"])
def test_the_flag_round_trips_through_the_launches(tmp_path, fmt):
    """--moe-shared-expert-overlap (Megatron-LM) and the model config's moe_shared_expert_overlap
    (Megatron-Bridge) are read and written: DeepSeek-V3 with 1F1B comes back with it on."""
    from sim.commands.frameworks import export_text, import_launch

    sc = load_scenario(str(REPO / "scenarios/deepseek-v3-h800x2048-dualpipe.yaml"),
                       overrides=["parallelism.pipeline_schedule=1f1b", "training.moe_shared_expert_overlap=true"]
                       # (its BF16 moments: under Megatron-LM's --bf16 the master weights are remainders)
                       + (["training.store_param_remainders=true"] if fmt == "megatron" else []))
    text = export_text(sc, fmt)
    assert ("--moe-shared-expert-overlap" in text) if fmt == "megatron" else ("moe_shared_expert_overlap: true" in text)
    out = tmp_path / ("l.sh" if fmt == "megatron" else "c.yaml")
    out.write_text(text)
    data, notes = import_launch(out, cluster=f"{sc.cluster.topology.name}:{sc.derived.num_gpus}", fmt=fmt)
    assert build_scenario(data).training.moe_shared_expert_overlap is True
    assert not [n for n in notes if "moe-shared-expert-overlap" in n or "moe_shared_expert_overlap" in n], notes


def test_an_import_where_the_flag_changes_nothing_says_so(tmp_path):
    """A Megatron-LM launch of a dense model with --moe-shared-expert-overlap (Megatron-Core
    ignores it without shared experts): imported without it, and a note says why."""
    from sim.commands.frameworks import import_launch

    launch = (REPO / "scenarios/launch/gpt3-175b-a100x64.sh").read_text().replace(
        "--num-layers 96", "--num-layers 96 --moe-shared-expert-overlap")
    (tmp_path / "l.sh").write_text(launch)
    data, notes = import_launch(tmp_path / "l.sh", cluster="dgx-a100-hdr:64", fmt="megatron")
    assert "moe_shared_expert_overlap" not in data["training"]
    assert any("--moe-shared-expert-overlap not applied" in n and "no shared experts" in n for n in notes), notes


def test_the_sweeps_bounds_stay_below_the_steps(tmp_path):
    """The bounded sweep's lower bounds (sim.sweep.bound: kernels and blocking collectives, a
    launched one counting nothing) stay at or below every simulated step of a small MoE sweep
    with the overlap, the one-GPU probe leaving the flag to the layouts (sim.sweep.EP_ONLY_KEYS)."""
    from sim.sweep import SweepSpec, prepare, run_sweep
    from sim.sweep.bound import Bounds
    from sim.units import ns_to_s

    model = {"preset": "llama3-8b", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
             "num_query_groups": 4, "ffn_hidden_size": 512, "vocab_size": 1024, "num_experts": 4,
             "moe_router_topk": 2, "moe_shared_experts": 1, "max_position_embeddings": 8192}
    sets = ["training.seq_length=512", "training.global_batch_size=16", "training.moe_shared_expert_overlap=true",
            "parallelism.tp=1", "parallelism.zero_stage=1", "training.recompute=none"]
    spec = SweepSpec(model=model, gpus=8, topology="hgx-h200-ndr", overrides=sets, top=0, plots=False,
                     out=tmp_path / "s.csv", bound=False, workers=1)
    res = run_sweep(spec, progress=False)
    rows = [r for r in res.table if r["status"] == "ok"]
    assert len(rows) >= 10 and all(int(r["ep"]) > 1 for r in rows)     # (ep 1 refuses the flag)
    bounds = Bounds(prepare(spec).base, prepare(spec).layouts)
    for r in rows:
        assert bounds.coarse_ns(r["index"]) <= bounds.fine_ns(r["index"]) and \
            ns_to_s(bounds.fine_ns(r["index"])) <= r["step_time_s"], r["layout"]

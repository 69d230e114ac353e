"""Megatron-Core pipeline layouts: `pipeline_model_parallel_layout` and
`account_for_embedding/loss_in_pipeline_split` (sim.pipeline_layout, sim.config).

Truths: Megatron-Core's documented layout semantics (transformer_config.py: stage i = a x pp + b
is vpp stage a of pp rank b; '|' splits stages, `X*N` and `(...)*N` repeat), the Llama 3 paper's
405B split (126 = 7 + 14 x 8 + 7, sec. 3.3.2), and per-stage memory worked by hand from the
parameter count of a GPT layer and Korthikanti et al. 2022's activation formula."""

import subprocess
import sys

import pytest

from sim import pipeline_layout as pl
from sim.config import build_scenario, resolved_dict
from sim.errors import ConfigError
from sim.memory import memory_report
from sim.units import GiB


def test_deepseek_string_expands_as_megatron_documents():
    # DeepSeek-V3's documented layout with the MTP item replaced by a decoder layer:
    # stage 0 = E + 3 layers, 29 stages of 2, then one layer, then the loss alone.
    stages = pl.parse("Et*3|(tt|)*29,t|L")
    assert len(stages) == 32
    assert stages[0] == ["E", "t", "t", "t"]
    assert all(st == ["t", "t"] for st in stages[1:30])
    assert stages[30] == ["t"] and stages[31] == ["L"]
    pl.check(stages, 3 + 58 + 1, 16)


def test_list_form_and_long_names_equal_the_string_form():
    assert pl.parse([["embedding", "decoder"], ["decoder", "decoder", "decoder", "loss"]]) == \
        pl.parse("Et|t*3L") == [["E", "t"], ["t", "t", "t", "L"]]


@pytest.mark.parametrize("text, rule", [
    ("Et*3|(tt|)*29,m|L", "MTP"),
    ("Et|tX|L", "'X'"),
    ("Et|(tt|L", "unbalanced"),
    ("E*|tL", "'*'"),
    # a repetition too large is refused before it is made (MemoryError, OverflowError, or 4.9 GB)
    ("Et*99999999999999999|t*6L", "repeats 't' 99,999,999,999,999,999 times: expands to more than 1,000,000"),
    ("(t*6|)*99999999999999999999", r"repeats 't\*6\|' 99,999,999,999,999,999,999 times"),
    ("(Et*6|)*999999999", r"repeats 'Et\*6\|' 999,999,999 times"),
    ("((t|)*1000|)*1001", r"repeats 't\|t\|.*\|' 1,001 times: expands to more than 1,000,000"),
])
def test_bad_strings_say_why(text, rule):
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(pl.LayoutError, match=rule):
        pl.parse(text)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000     # KiB: nothing huge made


def test_check_rules():
    with pytest.raises(pl.LayoutError, match="multiple of pipeline_model_parallel_size"):
        pl.check(pl.parse("Et|t|tL"), 3, 2)
    with pytest.raises(pl.LayoutError, match="places 3 decoder layers; the model has num_layers = 4"):
        pl.check(pl.parse("Et|ttL"), 4, 2)
    with pytest.raises(pl.LayoutError, match="embedding E"):
        pl.check(pl.parse("tE|tL"), 2, 2)
    with pytest.raises(pl.LayoutError, match="loss L"):
        pl.check(pl.parse("Et|Lt"), 2, 2)


def _scenario(par, *, model=None, schedule_extra=None, gbs=2):
    m = model or {"num_layers": 6, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 1000,
                  "max_position_embeddings": 256, "hidden_dropout": 0.1, "attention_dropout": 0.1}
    return build_scenario({
        "model": m,
        "cluster": {"topology": "dgx-h100-ndr"},
        "parallelism": {"tp": 1, "dp": 1, **par},
        "training": {"seq_length": 256, "micro_batch_size": 1, "global_batch_size": gbs,
                     "recompute": "none", "attention_backend": "unfused", **(schedule_extra or {})},
        "simulation": {"network": "analytical"}})


def test_llama3_405b_even_split_counting_embedding_and_loss():
    sc = build_scenario({"model": "llama3-405b", "cluster": {"topology": "dgx-h100-ndr"},
                         "parallelism": {"tp": 8, "pp": 16, "vpp": 2, "dp": 1,
                                         "account_for_embedding_in_pipeline_split": True,
                                         "account_for_loss_in_pipeline_split": True},
                         "training": {"seq_length": 8192, "global_batch_size": 16}})
    d = sc.derived
    # Llama 3 paper sec. 3.3.2: 7 layers on the first and last pipeline rank, 8 elsewhere
    assert d.layers_per_rank == (7,) + (8,) * 14 + (7,)
    assert d.layers_per_virtual_stage[0] == 3 and d.layers_per_virtual_stage[-1] == 3
    assert set(d.layers_per_virtual_stage[1:-1]) == {4}
    assert d.embedding_stages == (0,) and d.loss_stages == (31,)
    assert sc.parallelism.pipeline_schedule == "interleaved-1f1b"


def test_layout_sets_vpp_and_places_stages_on_ranks():
    sc = _scenario({"pp": 2, "pipeline_model_parallel_layout": [["E", "t"], ["t", "t", "t"], ["t"], ["t", "L"]]},
                   gbs=4)
    d, p = sc.derived, sc.parallelism
    assert p.vpp == 2 and p.pipeline_schedule == "interleaved-1f1b"
    assert d.layers_per_virtual_stage == (1, 3, 1, 1)
    assert d.stage_rank == (0, 1, 0, 1)         # stage a x pp + b on rank b
    assert d.first_layer_of_virtual_stage == (0, 1, 4, 5)
    assert d.layers_per_rank == (2, 4)
    assert resolved_dict(sc)["parallelism"]["pipeline_model_parallel_layout"] == "E,t|t*3|t|t,L"


def test_memory_per_stage_of_a_layout_by_hand():
    """pp 2, GPipe, 2 microbatches, layout E+1 layer | 5 layers+L: per-rank states and
    activations from the GPT layer's 12h^2 + 13h parameters and Korthikanti's 34sbh + 5as^2b."""
    sc = _scenario({"pp": 2, "pipeline_schedule": "gpipe",
                    "pipeline_model_parallel_layout": "E,t|t*5,L"})
    h, a, s, b, V, P = 512, 8, 256, 1, 1000, 256
    layer = 12 * h * h + 13 * h          # QKV, out-proj, fc1, fc2 with biases, two LayerNorms
    rank0 = layer + V * h + P * h        # word + learned position embeddings
    rank1 = 5 * layer + 2 * h + V * h    # final LayerNorm, untied LM head
    rep = memory_report(sc)
    for st, n in zip(rep.per_stage, (rank0, rank1)):
        assert st.weights_bytes == pytest.approx(2 * n)
        assert st.grads_bytes == pytest.approx(2 * n)
        assert st.optimizer_bytes == pytest.approx(12 * n)
    act_layer = s * b * h * 34 + 5 * a * s * s * b       # Korthikanti eq. 1 (16-bit, dropout)
    emb = s * b * h                                       # embedding-dropout mask
    head = 2 * 2 * s * b * h + 4 * s * b * V              # final-norm and head inputs, fp32 logits
    m = 2                                                 # GPipe holds every microbatch
    assert rep.per_stage[0].activations_bytes == pytest.approx(m * (act_layer + emb))
    assert rep.per_stage[1].activations_bytes == pytest.approx(m * (5 * act_layer + head))


def test_layout_with_empty_end_stages_places_embedding_and_loss_once():
    # E alone on stage 0 and L alone on the last stage: each counted once, by its item
    sc = _scenario({"pp": 2, "pipeline_model_parallel_layout": "E|t*3|t*3|L"}, gbs=4)
    d = sc.derived
    assert d.layers_per_virtual_stage == (0, 3, 3, 0)
    rep = memory_report(sc)
    h, V, P = 512, 1000, 256
    layer = 12 * h * h + 13 * h
    assert rep.per_stage[0].weights_bytes == pytest.approx(2 * (3 * layer + V * h + P * h))
    assert rep.per_stage[1].weights_bytes == pytest.approx(2 * (3 * layer + 2 * h + V * h))


def test_layout_simulates_and_uneven_chunks_change_the_step():
    from sim.engine.simulate import simulate
    even = simulate(_scenario({"pp": 2, "pipeline_model_parallel_layout": "E,t*2|t*2|t|t,L"}, gbs=4))
    skew = simulate(_scenario({"pp": 2, "pipeline_model_parallel_layout": "E,t*3|t*2|t|L"}, gbs=4))
    assert even.makespan_ns > 0 and skew.makespan_ns > 0
    # rank 0 holds 3 + 1 layers instead of 2 + 1 and sets the pace: the skewed layout is slower
    assert skew.makespan_ns > even.makespan_ns


@pytest.mark.parametrize("par, key, rule", [
    ({"pp": 2, "vpp": 3, "pipeline_model_parallel_layout": "E,t|t*3|t|t,L"},
     "parallelism.virtual_pipeline_model_parallel_size", "make 2 chunks per rank"),
    ({"pp": 2, "pipeline_model_parallel_layout": "E,t|t*3|t|t,L", "account_for_loss_in_pipeline_split": True},
     "parallelism.pipeline_model_parallel_layout", "one or the other"),
    ({"pp": 2, "pipeline_model_parallel_layout": "E,t*3|t*3,L", "decoder_first_pipeline_num_layers": 3},
     "parallelism.decoder_first_pipeline_num_layers", "cannot be combined"),
    ({"pp": 2, "pipeline_model_parallel_layout": "E,t*3|t*3,L", "pipeline_schedule": "zbv"},
     "parallelism.pipeline_schedule", "V-shaped"),
    ({"pp": 2, "pipeline_model_parallel_layout": "E,t*3|t*2,L"},
     "parallelism.pipeline_model_parallel_layout", "places 5 decoder layers"),
    ({"pp": 4, "account_for_embedding_in_pipeline_split": True},
     "parallelism.account_for_embedding_in_pipeline_split", "= 7 must be divisible"),
])
def test_bad_layouts_name_the_key(par, key, rule):
    with pytest.raises(ConfigError, match=rule) as e:
        _scenario(par, gbs=8)
    assert e.value.key == key


def test_uneven_stages_not_divisible_by_vpp_suggest_a_layout():
    with pytest.raises(ConfigError) as e:
        _scenario({"pp": 2, "vpp": 2, "decoder_first_pipeline_num_layers": 3}, gbs=4,
                  model={"num_layers": 7, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 1000})
    assert "'E,t|t*2|t*2|t*2,L'" in e.value.message
    # and the suggestion is itself a valid layout with the asked-for first stage
    sc = _scenario({"pp": 2, "pipeline_model_parallel_layout": "E,t|t*2|t*2|t*2,L"}, gbs=4,
                   model={"num_layers": 7, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 1000})
    assert sc.derived.layers_per_rank == (3, 4)


def test_cli_bad_layout_exits_2_without_traceback(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("model: gpt-1.7b\ncluster: {topology: dgx-a100-hdr}\n"
                 "parallelism: {pp: 2, pipeline_model_parallel_layout: 'Et*3|(tt|)*10,m|L'}\n"
                 "training: {seq_length: 2048, global_batch_size: 8}\n")
    r = subprocess.run([sys.executable, "-m", "sim", "memory", str(f)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "parallelism.pipeline_model_parallel_layout" in r.stderr and "MTP" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("zero", [2, 3])
def test_bundled_llama3_405b_runs_the_papers_layout_on_16384_gpus(zero):
    """TP8 PP16 VPP2, 7-layer first/last ranks, ZeRO-2 (and the bundled FSDP-without-reshard,
    ZeRO-3): interleaved 1F1B with 16 microbatches per pipeline idles each rank about
    (p - 1) / v of a microbatch's forward+backward out of (m + (p - 1) / v) of them:
    7.5 / 23.5 = 0.319 (Narayanan et al. 2021 sec. 2.2.2; exposed TP time counts apart, end
    ranks one layer short). FSDP adds the first forward of each chunk waiting for its gathers
    (not prefetched across chunks), but no re-gather per microbatch: torch pipelining's FSDP2
    keeps the weights gathered until the stage's last backward (the bubble was 0.428 with them)."""
    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    # (with 16-bit gradients: the paper's FP32 accumulation over the microbatches puts sim5d's peak
    # at 82.8 GiB, as its interleaved 1F1B with 16 microbatches on 16 stages holds every
    # microbatch's activations of both chunks, where Meta's tuned order holds fewer; docs/accuracy.md)
    sets = ["training.grad_reduce_in_fp32=false"] + (
        [] if zero == 3 else ["parallelism.zero_stage=2", "parallelism.reshard_after_forward=null"])
    sc = load_scenario("scenarios/llama3-405b-h100x16384.yaml", sets)
    assert sc.derived.num_gpus == 16384 and sc.parallelism.zero_stage == zero
    assert sc.derived.layers_per_rank == (7,) + (8,) * 14 + (7,)
    summary = simulate(sc).summary()
    assert summary["fits_in_memory"]
    if zero == 2:
        assert summary["bubble_fraction"] == pytest.approx(7.5 / 23.5, abs=0.02)
    else:
        assert 7.5 / 23.5 < summary["bubble_fraction"] < 0.40


def test_readme_llama3_table4_row_is_what_sim5d_gives():
    """README's accuracy row for the Llama 3 paper's Table 4: the simulated TFLOP/s per GPU of
    the two bundled 405B scenarios against the paper's 400 (8K) and 380 (128K)."""
    import re
    from pathlib import Path

    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    row = next(line for line in (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
               if line.startswith("| Llama 3 paper Table 4"))
    quoted = [(int(a), int(b)) for a, b in re.findall(r"(\d+) vs (\d+)", row)]
    got = [round(simulate(load_scenario(f"scenarios/{s}.yaml")).summary()["model_tflops_per_gpu"])
           for s in ("llama3-405b-h100x16384", "llama3-405b-h100x16384-cp16-128k")]
    assert [q[0] for q in quoted] == got and [q[1] for q in quoted] == [400, 380]
    mape = sum(abs(g / p - 1) for g, p in zip(got, (400, 380))) / 2
    assert f"| {100 * mape:.1f}% | -{100 * mape:.1f}% |" in row


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_a_layout_under_a_v_schedule_places_stages_in_the_v(schedule):
    """Stage s on rank s, stage 2pp - 1 - s on rank s (the V the even split uses, and
    torchtitan's stage_ids_this_rank); each rank runs exactly its stages' layers."""
    from conftest import assert_engine_invariants, base_scenario
    from sim.config import build_scenario
    from sim.engine.simulate import simulate

    sc = build_scenario(base_scenario(parallelism={
        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 2, "data_parallel_size": 4,
        "pipeline_schedule": schedule, "pipeline_model_parallel_layout": "E,t*1|t*3|t*3|t*1,L"}))
    d = sc.derived
    assert (d.layers_per_virtual_stage, d.stage_rank, d.layers_per_rank) == ((1, 3, 3, 1), (0, 1, 1, 0), (2, 6))
    res = simulate(sc)
    assert_engine_invariants(res)
    held = {0: {0, 7}, 1: {1, 2, 3, 4, 5, 6}}
    for r in res.records:
        if r.name.startswith("F L") and r.cat == "compute":
            assert int(r.name.split()[1][1:]) in held[res.pp_rank_of[r.rank]], r

"""The search space, its constraints and the ranking, on cases small enough to check by hand."""

import dataclasses
import functools
import itertools
import operator

import pytest

from perfmodels import presets
from perfmodels.specs import Model, Training, combination_problems
from perfmodels.steptime import predict
from tuner import SearchOptions, recommend
from tuner.space import factorizations

TINY = Model(name="tiny", num_layers=4, hidden_size=64, num_attention_heads=2, seq_length=16, vocab_size=64)


def test_factorizations_count_and_products():
    # ordered 5-factorizations: C(k+4, 4) per prime power p^k, multiplied over primes
    assert len(factorizations(8)) == 35
    assert len(factorizations(12)) == 15 * 5
    assert len(factorizations(1)) == 1
    for n in (8, 12, 30):
        rows = factorizations(n)
        assert (rows.prod(axis=1) == n).all()
        assert len({tuple(r) for r in rows}) == len(rows)


def test_exact_plan_set_for_8_gpus_matches_brute_force():
    """With every option pinned, the valid plans are exactly the grids a brute force over all
    5-tuples accepts under the rules written out here independently."""
    cluster = presets.cluster("selene", 8)
    training = Training(global_batch_size=16)
    options = SearchOptions(micro_batch_size=(1,), schedule=("1f1b",), recompute=("none",), zero_stage=(0,),
                            placement=(("col", "row", "depth", "inter", "data"),))
    rec = recommend(TINY, cluster, training, top_k=1000, search=options)
    got = {(c.plan.G_data, c.plan.G_inter, c.plan.G_intra_d, c.plan.G_intra_r, c.plan.G_intra_c)
           for c in rec.candidates}
    expected = set()
    for d, p, z, r, c in itertools.product([1, 2, 4, 8], repeat=5):
        if d * p * z * r * c != 8:
            continue
        if 2 % r or 64 % (r * c) or 256 % (r * c) or 16 % (d * z) or p > 4:
            continue
        if p > 1 and 16 // (d * z) < p:  # 1F1B needs a micro-batch per stage
            continue
        expected.add((d, p, z, r, c))
    assert got == expected
    assert rec.num_valid == len(expected)
    for cand in rec.candidates:  # each candidate is a valid plan the model can predict
        assert not combination_problems(TINY, cluster, training, cand.plan)
        assert predict(TINY, cluster, training, cand.plan).iteration_time_s == pytest.approx(
            cand.prediction.iteration_time_s)


def test_candidates_are_sorted_and_best_is_first():
    rec = recommend(
        presets.model("gpt3-1.7b"), presets.cluster("selene", 64), Training(global_batch_size=512), top_k=20
    )
    times = [c.prediction.iteration_time_s for c in rec.candidates]
    # non-decreasing; exact ties (to float noise) are ordered simpler-plan first
    assert all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(times))
    assert rec.best is rec.candidates[0]
    assert [c.rank for c in rec.candidates] == list(range(1, 21))
    assert rec.num_evaluated > rec.num_valid > 20


def test_small_model_large_batch_slow_network_gets_pure_data_parallelism():
    """GPT-2 small fits on one GPU; with a large batch every sample can stay local, and any
    tensor or pipeline split only adds communication over a slow network."""
    cluster = dataclasses.replace(presets.cluster("selene", 16), inter_node_bandwidth_GBps=1.0,
                                  intra_node_bandwidth_GBps=20.0)
    rec = recommend(presets.model("gpt2-small"), cluster, Training(global_batch_size=1024), top_k=3)
    best = rec.best.plan
    assert (best.G_data, best.G_inter, best.G_intra_d, best.G_intra_r, best.G_intra_c) == (16, 1, 1, 1, 1)


def test_every_pruning_reason_is_counted_with_examples():
    model = Model(name="odd", num_layers=3, hidden_size=24, num_attention_heads=6, num_query_groups=3,
                  ffn_hidden_size=96, seq_length=2048, vocab_size=512)
    cluster = dataclasses.replace(presets.cluster("selene", 16), gpu=dataclasses.replace(
        presets.gpu("A100-80GB"), memory_gib=1.0))
    # the exhaustive search checks every plan against every rule; the default one stops at what a bound
    # proves (a grid whose every option needs more memory is never checked against the option rules)
    bounded = recommend(model, cluster, Training(global_batch_size=12), top_k=3,
                        search=SearchOptions(sequence_parallel=(False, True)))
    assert "needs more memory per GPU than available with every option" in " | ".join(bounded.pruned)
    rec = recommend(model, cluster, Training(global_batch_size=12), top_k=3,
                    search=SearchOptions(sequence_parallel=(False, True), exhaustive=True))
    assert bounded.num_evaluated + bounded.num_proved_slower == rec.num_evaluated
    reasons = " | ".join(rec.pruned)
    for needle in ("does not divide model.num_attention_heads=6", "model.num_query_groups=3",
                   "does not divide model.hidden_size=24", "does not divide training.global_batch_size=12",
                   "exceeds model.num_layers=3", "num_microbatches >= G_inter", "sequence_parallel needs",
                   "gpipe is dominated", "needs more memory per GPU than the 1 GiB"):
        assert needle in reasons, needle
    for reason, examples in rec.pruned_examples.items():
        assert examples, reason
    assert "G_intra_r=4 does not divide model.num_attention_heads=6" in functools.reduce(
        operator.iadd, rec.pruned_examples.values(), []
    )


def test_pins_restrict_the_space():
    rec = recommend(
        presets.model("gpt3-1.7b"),
        presets.cluster("selene", 64),
        Training(global_batch_size=512),
        top_k=50,
        search=SearchOptions(G_intra_r=(2,), G_intra_c=(1,), G_intra_d=(1,), recompute=("full",)),
    )
    assert rec.candidates and all(
        c.plan.G_intra_r == 2 and c.plan.recompute == "full" for c in rec.candidates
    )
    assert rec.pruned["excluded by the search pins"] > 0


def test_no_valid_layout_is_reported_not_raised():
    huge = presets.model("gpt3-1t")
    rec = recommend(huge, presets.cluster("selene", 8), Training(global_batch_size=8), top_k=5)
    assert rec.best is None and rec.candidates == []
    assert any("memory" in r for r in rec.pruned)
    assert "no layout fits" in rec.explanation


def test_explanation_names_the_differences():
    rec = recommend(
        presets.model("gpt3-175b"),
        presets.cluster("selene", 1024),
        Training(global_batch_size=1536),
        top_k=10,
    )
    assert "faster than the runner-up" in rec.explanation
    assert "largest component differences" in rec.explanation


def test_long_sequences_search_context_parallelism_not_cross_node_tensor_parallelism():
    """Llama-3 8B at 131,072 tokens on 64 H100s: NeMo runs context parallelism; the search must not
    answer with tensor parallelism across nodes (G_intra_r > 8)."""
    import dataclasses

    from perfmodels import presets
    from perfmodels.specs import Training
    from tuner import recommend

    model = dataclasses.replace(presets.model("llama3.1-8b"), seq_length=131072)
    training = Training(global_batch_size=64, stack="megatron-core")
    rec = recommend(model, presets.cluster("eos").with_gpus(64), training, top_k=3)
    best = rec.best.plan
    assert best.G_cp > 1 and best.G_intra_r <= 8, best
    # at the default 8192 tokens the dense space is what it always was: no CP plan is generated
    short = recommend(presets.model("llama3.1-8b"), presets.cluster("eos").with_gpus(8),
                      Training(global_batch_size=64, stack="megatron-core"), top_k=3)
    assert all(c.plan.G_cp == 1 and c.plan.G_ep == 1 for c in short.candidates)


def test_expert_parallel_search_only_over_divisors_of_the_experts():
    from perfmodels import presets
    from perfmodels.specs import Training
    from tuner import recommend
    from tuner.types import SearchOptions

    model = presets.model("mixtral-8x7b")  # 8 experts
    training = Training(global_batch_size=64, stack="megatron-core")
    cluster = presets.cluster("eos").with_gpus(16)
    options = SearchOptions(G_inter=(1, 2), micro_batch_size=(1,))
    rec = recommend(model, cluster, training, top_k=20, search=options)
    assert rec.best is not None and rec.best.plan.G_ep > 1
    assert all(8 % c.plan.G_ep == 0 for c in rec.candidates)
    options = SearchOptions(G_ep=(3,), micro_batch_size=(1,))
    pinned = recommend(model, cluster, training, top_k=3, search=options)
    assert pinned.best is None, pinned.best
    assert pinned.pruned.get("G_ep does not divide model.num_moe_experts=8"), pinned.pruned


def test_expert_weights_that_cannot_fit_are_pruned_before_expansion():
    from perfmodels import presets
    from perfmodels.specs import Training
    from tuner import recommend
    from tuner.types import SearchOptions

    # DeepSeek-V3 on 64 GPUs without a pipeline: E/G_ep experts of 58 layers in 16 bits need
    # 58 x 256/64 x 44M x 2 B = 20 GiB at EP64 but 41 GiB at EP32, ... 1.3 TiB at EP1
    rec = recommend(presets.model("deepseek-v3"), presets.cluster("eos").with_gpus(64),
                    Training(global_batch_size=512, stack="megatron-core"), top_k=1,
                    search=SearchOptions(G_inter=(1,), G_intra_r=(1,), G_etp=(1,), micro_batch_size=(1,)))
    reason = "the routed experts' 16-bit weights alone exceed the 80 GiB of a GPU"
    assert rec.pruned.get(reason, 0) > 0
    assert any("G_ep=1 " in example for example in rec.pruned_examples[reason])


def test_a_search_leaves_the_garbage_collector_as_it_found_it():
    """The search turns the cyclic collector off while it runs (`search._without_cycle_collection`)
    and back on only where it was on."""
    import gc

    model, cluster = presets.model("gpt3-1.7b"), presets.cluster("selene", 16)
    training = Training(global_batch_size=64)
    assert gc.isenabled()
    recommend(model, cluster, training, top_k=1)
    assert gc.isenabled()
    gc.disable()
    try:
        recommend(model, cluster, training, top_k=1)
        assert not gc.isenabled()
    finally:
        gc.enable()

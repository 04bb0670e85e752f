"""The one description both kinds of Model give the cost model (perfmodels/structure.py), and the
claim it rests on: a stage's cost is the sum over units of (copies on the stage) x (one copy's cost),
so the vectorized transformer is one block evaluated once and multiplied, and a layer list's Linears
are costed by the same function as a transformer's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from perfmodels import LayerSpec, Model, Plan, Training, presets
from perfmodels.compute import Rank, model_flops_per_token, stage_compute, unit_compute
from perfmodels.plans import from_plans
from perfmodels.structure import Linear, Other
from perfmodels.traffic import stage_shape, units_on_stage

CLUSTER = presets.cluster("selene", 64)
GPT = Model(name="gpt", num_layers=8, hidden_size=512, num_attention_heads=8, seq_length=256, vocab_size=1000)
PLANS = [Plan(G_data=8, G_intra_r=2, G_intra_c=2, G_intra_d=2, micro_batch_size=2),
         Plan(G_data=4, G_inter=2, G_intra_r=4, G_intra_c=2, micro_batch_size=1, recompute="full"),
         Plan(G_data=2, G_inter=4, G_intra_r=8, micro_batch_size=4, recompute="selective",
              schedule="interleaved-1f1b", virtual_stages=2)]


def test_a_transformer_is_its_block_repeated_its_head_and_its_embedding():
    llama = presets.model("llama3-8b")
    block, head, embedding = llama.units
    h, f, kv, s = llama.hidden_size, llama.ffn_hidden_size, llama.kv_hidden_size, llama.seq_length
    assert (block.placement, block.count, block.attention, block.params) == (
        "block", llama.num_layers, True, llama.params_per_layer)
    assert [(lin.k, lin.n, lin.transposed, lin.split, lin.rows_per_sample) for lin in block.linears] == [
        (h, h + 2 * kv, False, "grid", s), (h, h, True, "grid", s),
        (h, 2 * f, False, "grid", s), (f, h, True, "grid", s)]
    assert (head.placement, head.loss) == ("head", True)
    assert [(lin.k, lin.n, lin.vocab) for lin in head.linears] == [(h, llama.vocab_size, True)]
    assert (embedding.placement, embedding.params) == ("embedding", llama.embedding_params)
    assert embedding.layers == ()
    assert llama.kind == "transformer" and llama.tokens_per_sample == s


def test_a_layer_list_is_one_unit_spread_over_the_stages_with_its_layers_in_order():
    model = Model.from_layers([LayerSpec(name="fc1", in_features=64, out_features=256, rows_per_sample=32),
                               LayerSpec(name="norm", kind="other", params=512, flops_per_sample=1e4,
                                         activation_elements_per_sample=256),
                               LayerSpec(name="fc2", in_features=256, out_features=64, rows_per_sample=32,
                                         transpose=True, parallel=False)], name="mlp")
    (unit,) = model.units
    assert (model.kind, model.depth, model.tokens_per_sample, unit.placement) == ("layers", 3, 1, "spread")
    assert unit.layers == (Linear("fc1", 64, 256, 32, split="auto"), Other("norm", 512, 1e4, 256.0),
                           Linear("fc2", 256, 64, 32, transposed=True, split="plain"))
    assert model_flops_per_token(model) == 2.0 * 64 * 256 * 32 + 1e4 + 2.0 * 256 * 64 * 32


@pytest.mark.parametrize("stack", ["megatron-lm", "torchtitan", "gridtune"])
def test_a_stage_is_the_sum_of_its_units_each_evaluated_once(stack):
    training = Training(global_batch_size=64, stack=stack)
    arrays = from_plans(PLANS)
    st = stage_shape(GPT.num_layers, arrays)
    comp = stage_compute(GPT, CLUSTER, training, arrays, st)
    rank = Rank.of(GPT, CLUSTER, training, arrays)
    expected = sum(units_on_stage(u, st, arrays) * unit_compute(GPT, u, rank).fwd
                   for u in GPT.units if u.layers)
    np.testing.assert_allclose(comp.fwd_s, expected, rtol=1e-12)
    # the repeated block is the vectorized part: twice the layers on one stage, twice its share
    one_stage = from_plans([Plan(G_data=8, G_intra_r=2, G_intra_c=2, G_intra_d=2, micro_batch_size=2)])
    twice = dataclasses.replace(GPT, num_layers=2 * GPT.num_layers)
    f1 = stage_compute(GPT, CLUSTER, training, one_stage, stage_shape(GPT.num_layers, one_stage)).fwd_s
    f2 = stage_compute(twice, CLUSTER, training, one_stage, stage_shape(twice.num_layers, one_stage)).fwd_s
    block = unit_compute(GPT, GPT.units[0], Rank.of(GPT, CLUSTER, training, one_stage)).fwd
    np.testing.assert_allclose(f2 - f1, GPT.num_layers * block, rtol=1e-9)


def test_a_layer_list_of_a_blocks_linears_costs_the_blocks_gemm_seconds():
    """The same Linear function costs a transformer's Linears and auto_parallelize's: a layer list
    of one block's four Linears (shapes that divide) takes the block's GEMM seconds."""
    block = GPT.units[0]
    as_layers = Model.from_layers([LayerSpec(name=lin.name, in_features=lin.k, out_features=lin.n,
                                             rows_per_sample=lin.rows_per_sample, transpose=lin.transposed)
                                   for lin in block.linears])
    training = Training(global_batch_size=64)
    for plan in (Plan(G_data=8, G_intra_r=2, G_intra_c=2, G_intra_d=2, micro_batch_size=2),
                 Plan(G_data=16, G_intra_r=1, G_intra_c=1, G_intra_d=4, micro_batch_size=1)):
        arrays = from_plans([plan])
        rank = Rank.of(GPT, CLUSTER, training, arrays)
        gemm_block = unit_compute(GPT, block, rank).gemm
        gemm_layers = unit_compute(as_layers, as_layers.units[0], rank).gemm
        np.testing.assert_allclose(gemm_layers, gemm_block, rtol=1e-12)


def test_the_kinds_are_explicit_and_a_missing_field_is_named():
    with pytest.raises(ValueError, match=r"model.hidden_size must be a positive integer, got 0 \(a transf"):
        Model(num_layers=2, num_attention_heads=4, seq_length=8, vocab_size=32)
    with pytest.raises(ValueError, match=r"model.num_layers=3 but model.layers lists 1 layers"):
        Model(num_layers=3, layers=(LayerSpec(in_features=4, out_features=4),))
    assert Model(layers=(LayerSpec(in_features=4, out_features=4),)).num_layers == 1

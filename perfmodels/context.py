"""Context parallelism (G_cp): each sample's sequence split over G_cp ranks, attention as a ring.

What the ranks do (Megatron-Core `--context-parallel-size` with Transformer Engine's
`cp_comm_type="p2p"`, its default, `transformer_engine/pytorch/attention.py`
`AttnFuncWithCPAndKVP2P`; torchtitan's ring attention over SDPA is the same exchange):
- causal load balancing: the sequence is cut in 2*G_cp chunks and cp rank i holds chunks i and
  2*G_cp-1-i (Megatron-Core `get_batch_on_this_cp_rank`), so every rank has the same causal work:
  1/G_cp of the full attention, T_c = micro_batch_size * seq / G_cp tokens;
- everything but attention is local to the rank's T_c tokens: the Linears, norms and the activation
  memory shrink by G_cp (the cp ranks act as data-parallel ranks with shorter samples, and the
  parameters' gradients are reduced over the data and cp ranks together, Megatron's dp-cp group,
  counted under "data" with G_data * G_cp ranks);
- attention runs G_cp steps; in each it computes against one chunk's keys and values while it
  sends them on around the ring and receives the next (forward: G_cp - 1 hops of K and V; backward:
  G_cp - 1 hops of K, V and G_cp of dK, dV, the last returning each gradient to its owner). A hop
  hides behind the step's attention compute: only what it takes beyond 1/G_cp of the attention
  time is exposed (`ring_exposed_s`).

This module turns a context-parallel plan into the equivalent grid the rest of perfmodels already
costs (`view`: samples of seq / G_cp tokens attending over the whole sequence, G_cp times as many of
them, G_data * G_cp data ranks), and adds the ring: its events (the byte contract with the engine,
`ring_events`) and its exposed time.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfmodels import collectives
from perfmodels.plans import PlanArrays
from perfmodels.specs import Cluster, Model, Training


def view(model: Model, training: Training, arrays: PlanArrays, cp: int) -> tuple[Model, Training, PlanArrays]:
    """The grid that costs like `arrays` (all of context-parallel degree `cp`): each rank's
    samples are its T_c-token chunks (`seq_length / cp`) attending over the whole sequence
    (`attention_span`), `cp` times as many of them in the global batch, over G_data * cp data ranks."""
    if cp == 1:
        return model, training, arrays
    s = model.seq_length
    if s % cp:
        raise ValueError(f"G_cp={cp} does not divide model.seq_length={s}")
    model_v = replace(model, seq_length=s // cp, attention_span=model.span)
    training_v = replace(training, global_batch_size=training.global_batch_size * cp)
    arrays_v = replace(arrays, G_data=arrays.G_data * cp, G_cp=np.ones_like(arrays.G_cp))
    return model_v, training_v, arrays_v


def kv_bytes_per_token(model: Model, training: Training, arrays: PlanArrays) -> np.ndarray:
    """Bytes of one token's keys and values on this rank: 2 x (local query groups x head size) x e,
    the groups split over the row ranks (replicated where there are fewer groups than ranks); for
    multi-latent attention the up-projected keys (qk + rope) and values (v) of the local heads."""
    e = training.bytes_per_element
    G_r = arrays.G_intra_r.astype(np.float64)
    if model.multi_latent_attention:
        per_head = int(model.qk_head_dim) + int(model.qk_pos_emb_head_dim) + int(model.v_head_dim)
        return model.num_attention_heads / G_r * per_head * e
    groups = np.maximum(float(model.num_query_groups) / G_r, 1.0)
    return 2.0 * groups * model.head_dim * e


def ring_events(model_v: Model, training: Training, arrays_v: PlanArrays, cp: int,
                attention_layers: np.ndarray,
                m: np.ndarray, full_rc: np.ndarray) -> list:
    """The ring's sends and receives over "cp" for one stage and step (`model_v`, `arrays_v`: the
    `view`): per attention layer and micro-batch, forward G_cp - 1 sends and as many receives of K
    and V (2 * T_c * kvh * e bytes each), backward G_cp - 1 of K, V and G_cp of dK, dV; full
    recomputation repeats the forward ring."""
    from perfmodels.traffic import CommEvent

    if cp == 1:
        return []
    T_c = arrays_v.micro_batch_size * model_v.seq_length
    payload = np.asarray(T_c * kv_bytes_per_token(model_v, training, arrays_v), dtype=np.float64)
    per_mb = attention_layers * m
    out = []
    for phase, hops in (("fwd", (cp - 1) * per_mb), ("bwd", (2 * cp - 1) * per_mb),
                        ("recompute", (cp - 1) * per_mb * full_rc)):
        for op in ("send", "recv"):
            out.append(CommEvent("cp", op, phase, "cp_ring", payload, np.asarray(hops, dtype=np.float64)))
    return out


def ring_exposed_s(cluster: Cluster, model_v: Model, training: Training, arrays_v: PlanArrays, cp: int,
                   geo_cp: dict[str, np.ndarray], attention_fwd_s: np.ndarray, attention_bwd_s: np.ndarray,
                   recompute: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(total, exposed) seconds of one attention layer's ring per micro-batch. One hop moves
    2 * T_c * kvh * e bytes between neighbours (over NVLink, or over the NIC when the cp group
    crosses nodes: the slowest hop sets the step) and hides behind that step's attention, 1/G_cp of
    the layer's: forward G_cp - 1 hops, backward G_cp hops (K, V onward and dK, dV back travel the
    full-duplex links at once), again in forward under full recomputation (`recompute`: 1 or 0)."""
    n = len(arrays_v)
    if cp == 1:
        return np.zeros(n), np.zeros(n)
    payload = arrays_v.micro_batch_size * model_v.seq_length * kv_bytes_per_token(model_v, training, arrays_v)
    two = np.full(n, 2.0)
    alpha, busbw = collectives.link_constants(cluster, "send_recv", two, geo_cp["intra"], np.ones(n))
    hop = collectives.collective_time_s("send_recv", payload, two, alpha, busbw)
    fwd_hops, bwd_hops = cp - 1.0, float(cp)
    exposed_fwd = fwd_hops * np.maximum(hop - attention_fwd_s / cp, 0.0)
    exposed_bwd = bwd_hops * np.maximum(hop - attention_bwd_s / cp, 0.0)
    total = (fwd_hops * (1.0 + recompute) + bwd_hops) * hop
    return total, exposed_fwd * (1.0 + recompute) + exposed_bwd

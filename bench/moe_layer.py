"""One rank's mixture-of-experts layer on a GPU, forward + backward, against `perfmodels.experts`.

`perfmodels.experts.layer_compute` prices one MoE layer per micro-batch on a rank as the router GEMM,
one grouped GEMM per expert projection (`grouped_gemm_s`), and memory-bound passes: the token
permutation and unpermutation (`PERMUTE_PASSES` over the T*k dispatched tokens), the activation
function, and the fp32 router passes; backward is twice the forward. This script runs that layer's
compute on one GPU in bf16 with PyTorch's own kernels, so the model's price can be checked piece by
piece at the shapes of published MoE runs:

  router    logits = x W_r (T x h -> E), softmax in fp32, top-k
  permute   the T*k (token, expert) pairs gathered in expert order (index_select)
  experts   fc1 and fc2 as `torch._grouped_mm` over the rank's E / G_ep experts, SwiGLU between
  combine   the expert outputs weighted by their router probabilities, summed back per token
            (index_add)

The rank receives T*k pairs spread evenly over its experts (G_ep ranks each send it their share:
no all-to-all is run, its time is the collectives' model), so m = T k G_ep / E tokens per expert.
Prints, per case, measured forward + backward milliseconds, the model's (`layer_compute` with a load
imbalance of 1, times 3), their ratio, and the measured split into router / permute / experts /
combine (forward only, CUDA events); then the same layer with the combine done as a fused
unpermute does it (each token gathers its k outputs: no atomic scatter-add). Writes
OUT/moe_layer.json.

    python bench/moe_layer.py [--out DIR] [--gpu H200]

Needs torch with CUDA and numpy; run it on the GPU machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (preset, G_ep, micro-batch size): the layouts of the published MoE rows of validation/data and
# their neighbours
CASES = (
    ("gpt-oss-120b", 8, 1), ("gpt-oss-120b", 8, 4),
    ("qwen3-30b-a3b", 16, 1), ("qwen3-30b-a3b", 8, 2),
    ("qwen3-235b-a22b", 32, 1), ("deepseek-v3", 64, 1), ("deepseek-v3", 8, 1),
    ("mixtral-8x7b", 8, 1),
)


def timed(fn, reps: int = 10) -> float:
    """Median seconds of `fn` over `reps` calls after two warm-up calls (CUDA events)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


class Layer:
    """The rank's share of one MoE layer, with weights and a micro-batch of tokens."""

    def __init__(self, h: int, f: int, experts: int, topk: int, ep: int, tokens: int,
                 device: str = "cuda") -> None:
        dev, bf = device, torch.bfloat16
        self.k, self.E, self.local = topk, experts, experts // ep
        self.x = torch.randn(tokens, h, device=dev, dtype=bf, requires_grad=True)
        self.w_router = torch.randn(h, experts, device=dev, dtype=bf, requires_grad=True)
        self.w1 = (torch.randn(self.local, 2 * f, h, device=dev, dtype=bf) * 0.02).requires_grad_()
        self.w2 = (torch.randn(self.local, h, f, device=dev, dtype=bf) * 0.02).requires_grad_()
        pairs = tokens * topk
        # the pairs this rank receives: every token k times, evenly over its local experts
        self.token_of_pair = torch.arange(pairs, device=dev) % tokens
        per_expert = pairs // self.local
        self.offs = torch.arange(per_expert, self.local * per_expert + 1, per_expert, device=dev,
                                 dtype=torch.int32)
        self.pairs = per_expert * self.local

    def router(self) -> torch.Tensor:
        logits = self.x @ self.w_router
        probs = torch.softmax(logits.float(), dim=-1)
        top, _ = torch.topk(probs, self.k, dim=-1)
        return top

    def permute(self) -> torch.Tensor:
        return self.x.index_select(0, self.token_of_pair[: self.pairs])

    def experts(self, tokens: torch.Tensor) -> torch.Tensor:
        up = torch._grouped_mm(tokens, self.w1.transpose(-2, -1), offs=self.offs)
        gate, lin = up.chunk(2, dim=-1)
        act = torch.nn.functional.silu(gate) * lin
        return torch._grouped_mm(act, self.w2.transpose(-2, -1), offs=self.offs)

    def combine(self, out: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        weights = top.reshape(-1)[: self.pairs].to(out.dtype)
        return torch.zeros_like(self.x).index_add(0, self.token_of_pair[: self.pairs], out * weights[:, None])

    def combine_gather(self, out: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        """The combine as a fused unpermute does it: each token reads its k expert outputs and writes
        their weighted sum once (pairs are stored k-major here: pair j*T + t is token t's j-th)."""
        T = self.x.shape[0]
        return (out.view(self.k, T, -1) * top.t().to(out.dtype)[:, :, None]).sum(0)

    def step(self, gather: bool = False) -> None:
        combine = self.combine_gather if gather else self.combine
        y = combine(self.experts(self.permute()), self.router())
        y.float().square().mean().backward()

    def forward_parts(self) -> dict[str, float]:
        with torch.no_grad():
            top = self.router()
            tokens = self.permute()
            out = self.experts(tokens)
            return {"router": timed(self.router), "permute": timed(self.permute),
                    "experts": timed(lambda: self.experts(tokens)),
                    "combine": timed(lambda: self.combine(out, top)),
                    "combine_gather": timed(lambda: self.combine_gather(out, top))}


def predicted_s(preset: str, ep: int, mb: int, gpu_name: str) -> tuple[float, float]:
    """(GEMM, memory-bound) seconds of one MoE layer's forward on the rank (`layer_compute`)."""
    import dataclasses

    from perfmodels import experts, presets
    from perfmodels.compute import gemm_curve, hbm_rate
    from perfmodels.plans import from_plans
    from perfmodels.specs import Plan, Training

    model = presets.model(preset)
    cluster = dataclasses.replace(presets.cluster("eos", ep), gpu=presets.gpu(gpu_name))
    training = Training(global_batch_size=ep * mb, dtype="bf16", expert_load_imbalance=1.0)
    arrays = from_plans([Plan(G_data=ep, G_ep=ep, G_etp=1, micro_batch_size=mb)])
    curve = gemm_curve(cluster, training)
    gemm, mem = experts.layer_compute(model, training, arrays, curve, hbm_rate(cluster))
    return float(gemm[0]), float(mem[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--gpu", default="H200", help="perfmodels GPU preset to predict with")
    args = ap.parse_args()
    from perfmodels import presets

    rows = []
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'case':28} {'m/expert':>8} {'meas ms':>8} {'model ms':>8} {'ratio':>6}   "
          "forward: router permute experts combine (ms) | model fwd gemm mem (ms)")
    for preset, ep, mb in CASES:
        model = presets.model(preset)
        tokens = mb * model.seq_length
        layer = Layer(model.hidden_size, model.moe_ffn_hidden_size, model.num_moe_experts,
                      model.moe_router_topk, ep, tokens)
        measured = timed(layer.step)
        gathered = timed(functools.partial(layer.step, gather=True))
        parts = layer.forward_parts()
        gemm, mem = predicted_s(preset, ep, mb, args.gpu)
        model_s = 3.0 * (gemm + mem)
        m_e = layer.pairs // layer.local
        row = dict(preset=preset, G_ep=ep, micro_batch=mb, tokens=tokens, tokens_per_expert=m_e,
                   measured_fwd_bwd_s=measured, measured_gather_combine_fwd_bwd_s=gathered,
                   model_fwd_bwd_s=model_s, model_fwd_gemm_s=gemm,
                   model_fwd_memory_s=mem, forward_parts_s=parts)
        rows.append(row)
        print(f"{preset + f' ep{ep} mb{mb}':28} {m_e:8d} {measured * 1e3:8.2f} {model_s * 1e3:8.2f} "
              f"{measured / model_s:6.2f}   {parts['router'] * 1e3:6.2f} {parts['permute'] * 1e3:7.2f} "
              f"{parts['experts'] * 1e3:7.2f} {parts['combine'] * 1e3:7.2f} | "
              f"{gemm * 1e3:6.2f} {mem * 1e3:6.2f} | gather combine: "
              f"fwd {parts['combine_gather'] * 1e3:.2f}, "
              f"fwd+bwd {gathered * 1e3:.2f} ({gathered / model_s:.2f} of the model)")
        del layer
        torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "moe_layer.json").write_text(json.dumps(
        dict(device=torch.cuda.get_device_name(), torch=torch.__version__, gpu_preset=args.gpu, rows=rows),
        indent=1))


if __name__ == "__main__":
    main()

"""The validation loader reads both vTrain ground-truth layouts and never crashes on a bad row."""

from pathlib import Path

import pytest

from perfmodels import published

_COLS = ("global batch,micro batch,hidden size,attention heads,# layers,sequence length,tensor parallelism,"
         "data parallelism,pipeline parallelism,iteration time (ms)")


def test_multi_and_single_node_vtrain_files(tmp_path: Path):
    multi = tmp_path / "multi.csv"
    multi.write_text(f"Parameters (billion),# GPUs,{_COLS}\n175,512,1536,2,12288,96,96,2048,4,8,16,54255.9\n")
    single = tmp_path / "single.csv"
    single.write_text(f"# GPUs,{_COLS}\n8,8,1,1024,16,20,1024,8,1,1,815.840026\n"
                      "4,16,oops,1024,16,12,1024,4,1,1,709.98\n")
    loaded = published.load([multi, single])
    assert [c.group for c in loaded.cases] == ["vtrain 175B on 512 GPUs", "vtrain h1024 L20 gb8 on 8 GPUs"]
    plan = loaded.cases[1].plans[0]
    assert (plan.G_intra_r, plan.G_data, plan.G_inter, plan.micro_batch_size) == (8, 1, 1, 1)
    assert loaded.cases[1].measured_time_s == pytest.approx(0.815840026)
    assert [s.case_id for s in loaded.skipped] == ["single.csv:3"]
    assert "oops" in loaded.skipped[0].reason


def _dev_row(metric: str, value: str, gpu: str = "A100 80GB") -> str:
    cols = {"source": "test", "model_name": "GPT", "num_layers": "24", "hidden_size": "2048", "num_heads": "16",
            "seq_len": "2048", "vocab_size": "51200", "global_batch_size": "512", "micro_batch_size": "4",
            "tp": "1", "pp": "1", "dp": "64", "num_gpus": "64", "gpu_type": gpu, "gpus_per_node": "8",
            "precision": "bf16", "recompute": "full", "metric_name": metric, "metric_value": value}
    return ",".join(cols.get(c, "") for c in _DEV_HEADER.split(","))


_DEV_HEADER = ("source,model_name,params_billion,num_layers,hidden_size,num_heads,ffn_hidden_size,seq_len,vocab_size,"
               "global_batch_size,micro_batch_size,tp,pp,dp,cp,virtual_pp,sequence_parallel,recompute,num_gpus,gpu_type,"
               "gpus_per_node,intra_node_interconnect,inter_node_interconnect,precision,metric_name,metric_value,notes")


@pytest.mark.parametrize("metric, value, seconds", [
    ("iteration_time_s", "2.5", 2.5),
    ("iteration_time_ms", "2500", 2.5),
    ("tokens_per_s", str(512 * 2048 / 2.5), 2.5),
    ("tokens_per_s_per_gpu", str(512 * 2048 / 2.5 / 64), 2.5),
    ("samples_per_s", str(512 / 2.5), 2.5),
])
def test_throughput_metrics_become_step_time(tmp_path: Path, metric, value, seconds):
    path = tmp_path / "dev.csv"
    path.write_text(_DEV_HEADER + "\n" + _dev_row(metric, value) + "\n" + _dev_row("iteration_time_s", "-1") + "\n")
    loaded = published.load([path])
    assert [c.measured_time_s for c in loaded.cases] == [pytest.approx(seconds)]
    assert "not a positive number" in loaded.skipped[0].reason


def test_export_parts_map_to_their_family_with_halved_nvlink(tmp_path: Path):
    path = tmp_path / "dev.csv"
    path.write_text(_DEV_HEADER + "\n" + _dev_row("iteration_time_s", "1", gpu="A800 80GB") + "\n"
                    + _dev_row("iteration_time_s", "1", gpu="H800") + "\n")
    a800, h800 = (c.cluster for c in published.load([path]).cases)
    assert (a800.gpu.name, a800.intra_node_bandwidth_GBps) == ("A100-80GB", 200.0)
    assert (h800.gpu.name, h800.intra_node_bandwidth_GBps) == ("H100-SXM", 200.0)


@pytest.mark.parametrize("text, preset", [("H20 96GB", "H20"), ("NVIDIA H200", "H200"), ("L40S PCIe", "L40S"),
                                          ("AMD MI210", "MI210"), ("A100-SXM4-40GB", "A100-40GB")])
def test_gpu_names_in_sources_map_to_presets(text, preset):
    from perfmodels import presets
    assert published._gpu_preset(text) == preset
    assert presets.gpu(preset).name == preset


def test_context_parallel_row_becomes_shorter_samples_over_more_data_ranks(tmp_path: Path):
    """cp=4: each rank holds a quarter of every 8192-token sequence and attends over all of it;
    the grid sees 4x as many 2048-token samples, data-parallel over dp x cp ranks."""
    path = tmp_path / "dev.csv"
    row = _dev_row("iteration_time_s", "3.0").split(",")
    header = _DEV_HEADER.split(",")
    for col, val in (("seq_len", "8192"), ("cp", "4"), ("dp", "16"), ("num_gpus", "64"), ("micro_batch_size", "1"),
                     ("global_batch_size", "64")):
        row[header.index(col)] = val
    path.write_text(_DEV_HEADER + "\n" + ",".join(row) + "\n")
    (case,) = published.load([path]).cases
    assert (case.model.seq_length, case.model.span) == (2048, 8192)
    assert case.training.global_batch_size == 256
    assert {p.G_data for p in case.plans} == {64}
    assert case.measured_time_s == pytest.approx(3.0)


def test_llama_style_rows_get_swiglu_and_grouped_query_attention(tmp_path: Path):
    path = tmp_path / "dev.csv"
    header = _DEV_HEADER.split(",")
    row = _dev_row("tflops_per_gpu", "400").split(",")
    for col, val in (("model_name", "Llama 3 70B"), ("num_layers", "80"), ("hidden_size", "8192"), ("num_heads", "64"),
                     ("ffn_hidden_size", "28672"), ("vocab_size", "128256"), ("seq_len", "8192"), ("tp", "8"),
                     ("pp", "4"), ("dp", "2"), ("global_batch_size", "64")):
        row[header.index(col)] = val
    path.write_text(_DEV_HEADER + "\n" + ",".join(row) + "\n")
    (case,) = published.load([path]).cases
    assert case.model.gated_mlp and case.model.num_query_groups == 8
    # Megatron's count: per layer forward 2*T*(2h^2 + 2h*kv + 3*h*f) + 4*T*s*h, four passes with full
    # recomputation (the row's), the head's three
    T, h, kv, f, s, L, V = 64 * 8192, 8192, 1024, 28672, 8192, 80, 128256
    flops = 4 * L * (2 * T * (2 * h * h + 2 * h * kv + 3 * h * f) + 4 * T * s * h) + 3 * 2 * T * h * V
    assert case.measured_time_s == pytest.approx(flops / (400e12 * 64))


def test_unstated_virtual_stages_are_enumerated_for_modern_runs_only(tmp_path: Path):
    path = tmp_path / "dev.csv"
    header = _DEV_HEADER.split(",")
    rows = []
    for source in ("Megatron-LM README (2024)", "Megatron-LM SC21 (2021)"):
        row = _dev_row("iteration_time_s", "5").split(",")
        for col, val in (("source", source), ("tp", "8"), ("pp", "4"), ("dp", "2"), ("micro_batch_size", "1"),
                         ("global_batch_size", "64")):
            row[header.index(col)] = val
        rows.append(",".join(row))
    path.write_text(_DEV_HEADER + "\n" + "\n".join(rows) + "\n")
    modern, old = published.load([path]).cases
    assert {p.virtual_stages for p in modern.plans} == {1, 2, 3, 4, 6}  # 24 layers >= 4 stages x v
    assert {p.virtual_stages for p in old.plans} == {1}

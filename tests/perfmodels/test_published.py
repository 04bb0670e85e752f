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
    assert [s.case_id for s in loaded.skipped] == ["single:3"]
    assert "oops" in loaded.skipped[0].reason

"""GPU names, card memory and interconnect rates from a row's hardware columns."""

import pytest

from perfmodels import presets
from validation.hardware import card, cluster_from_columns, gpu_preset, inter_per_gpu_GBps


@pytest.mark.parametrize(
    "text, preset",
    [
        ("H20 96GB", "H20"),
        ("NVIDIA H200", "H200"),
        ("L40S PCIe", "L40S"),
        ("AMD MI210", "MI210"),
        ("A100-SXM4-40GB", "A100-40GB"),
        ("V100-SXM2-16GB", "V100-16GB"),
        ("H100 80GB HBM3 SXM", "H100-SXM"),
    ],
)
def test_gpu_names_in_sources_map_to_presets(text, preset):
    assert gpu_preset(text) == preset
    assert presets.gpu(preset).name == preset


def test_unknown_gpu_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'TPU v5' is not a known GPU"):
        gpu_preset("TPU v5")


def test_stated_memory_picks_the_nearest_card_and_keeps_the_stated_size():
    gpu, memory = card("A100 (DGX-A100)", 40.0)
    assert (gpu.name, gpu.memory_gib, gpu.hbm_bandwidth_GBps) == ("A100-40GB", 40.0,
                                                                   presets.gpu("A100-40GB").hbm_bandwidth_GBps)
    assert not memory.assumed
    gpu, _ = card("H100", 96.0)  # a 96 GB H100 is not taken as 80 GB: it is the HBM2e, 500 W variant
    assert (gpu.name, gpu.memory_gib, gpu.hbm_bandwidth_GBps) == ("H100-96GB", 96.0, 2400.0)
    gpu, memory = card("H100 SXM", None)  # unstated: the SXM part's speeds, the family's largest memory
    assert (gpu.name, gpu.peak_tflops_bf16, gpu.memory_gib) == ("H100-SXM", 989.0, 96.0)
    assert memory.assumed


def test_unstated_memory_is_the_familys_largest_card_and_is_flagged():
    gpu, memory = card("A100 40GB", None)
    assert gpu.memory_gib == max(g.memory_gib for g in (presets.gpu("A100-40GB"), presets.gpu("A100-80GB")))
    assert memory.assumed.startswith("card memory not stated")


def test_export_parts_map_to_their_family_with_halved_nvlink():
    a800, _ = cluster_from_columns(gpu_type="A800 80GB", memory_gb=80.0, num_gpus=16, gpus_per_node=8,
                                   intra_text="", inter_text="")
    h800, _ = cluster_from_columns(gpu_type="H800", memory_gb=80.0, num_gpus=16, gpus_per_node=8,
                                   intra_text="", inter_text="")
    assert (a800.gpu.name, a800.intra_node_bandwidth_GBps) == ("A100-80GB", 200.0)
    assert (h800.gpu.name, h800.intra_node_bandwidth_GBps) == ("H100-SXM", 200.0)


@pytest.mark.parametrize("text, gbps", [("8x 200 Gb/s HDR InfiniBand per node", 25.0),
                                        ("InfiniBand compute links 8x 400 Gbit/s per node", 50.0),
                                        ("4x 25 GB/s Slingshot", 12.5), ("1600 Gbps node-node (RoCE)", 25.0)])
def test_network_rates_per_gpu(text, gbps):
    assert inter_per_gpu_GBps(text, 8, "A100") == pytest.approx(gbps)


def test_gb200_rows_get_the_gb200_card_and_its_nvlink_domain():
    """"GB200" is not read as a B200; an NVL72 rack is one NVLink domain (72 GPUs, or 64-GPU slices
    when 72 does not divide the job) unless the row states its GPUs per node."""
    assert gpu_preset("DGX-GB200 (NVL72)") == "GB200" and gpu_preset("DGX B200") == "B200"
    for gpus, domain in ((72, 72), (256, 64), (8, 8)):
        cluster, _ = cluster_from_columns(gpu_type="GB200", memory_gb=186.0, num_gpus=gpus,
                                          gpus_per_node=None, intra_text="", inter_text="")
        assert (cluster.gpu.name, cluster.gpus_per_node) == ("GB200", domain)
    cluster, _ = cluster_from_columns(gpu_type="GB200", memory_gb=186.0, num_gpus=64, gpus_per_node=4,
                                      intra_text="", inter_text="")
    assert cluster.gpus_per_node == 4

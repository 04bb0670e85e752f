"""Report figures on hand-built scores: MAPE, ranking groups on stated layouts, memory verdicts."""

import pytest

from perfmodels import presets
from perfmodels.specs import Model
from validation.cases import Case
from validation.hardware import CardMemory
from validation.scoring import CaseScore
from validation.summary import by_key, error_stats, memory_verdicts, ranking_groups

_MODEL = Model(
    name="gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024, vocab_size=51200
)


def _pair(cid, measured, predicted, *, group="g", stated=True, fits=True, fastest=None, mem=None, peak=None,
          oom=False, framework="megatron-core"):
    case = Case(
        case_id=cid,
        source=f"src-{framework}",
        framework=framework,
        group=group,
        model=_MODEL,
        cluster=presets.cluster("selene", 8),
        trainings=(),
        plans=(),
        measured_time_s=measured,
        measured_memory_gib=peak,
        expect_oom=oom,
        layout_stated=stated,
        card_memory=CardMemory(gib=80.0),
    )
    score = CaseScore(
        median_time_s=predicted,
        spread=1.0,
        fastest_fitting_time_s=fastest,
        memory_gib=mem or 10.0,
        capacity_gib=80.0,
        fits=fits,
        candidates=1,
        fitting=int(fits),
    )
    return case, score


def test_error_stats():
    st = error_stats([0.1, 0.2, 0.3, 0.4])
    assert (st.rows, st.mape, st.median) == (4, pytest.approx(0.25), pytest.approx(0.25))
    assert st.p90 == pytest.approx(0.37)


def test_ranking_groups_use_stated_layouts_only():
    scored = [
        _pair("a", 1.0, 1.1),
        _pair("b", 2.0, 1.9),
        _pair("c", 3.0, 3.5),
        _pair("d", 0.5, 9.0, stated=False),
    ]
    (g,) = ranking_groups(scored)
    assert (g.runs, g.spearman, g.measured_best_predicted_rank) == (3, pytest.approx(1.0), 1)
    scored = [_pair("a", 1.0, 2.5), _pair("b", 2.0, 1.9), _pair("c", 3.0, 1.0)]
    (g,) = ranking_groups(scored)
    assert (g.spearman, g.measured_best_predicted_rank) == (pytest.approx(-1.0), 3)


def test_per_framework_errors():
    scored = [_pair("a", 1.0, 1.1), _pair("b", 2.0, 3.0, framework="fsdp")]
    stats = by_key(scored, "framework")
    assert stats["megatron-core"].mape == pytest.approx(0.1) and stats["fsdp"].mape == pytest.approx(0.5)
    assert set(by_key(scored, "source")) == {"src-megatron-core", "src-fsdp"}


def test_memory_verdicts():
    scored = [_pair("ran-fits", 1.0, 1.0, mem=44.0, peak=40.0), _pair("ran-oom", 1.0, 1.0, fits=False),
              _pair("oom-caught", None, 1.0, fits=False, oom=True), _pair("oom-missed", None, 1.0, oom=True)]
    v = memory_verdicts(scored)
    assert v.false_oom == ["ran-oom"]
    assert (v.oom_rows, v.oom_caught) == (2, 1)
    assert (v.memory.rows, v.memory.mape) == (1, pytest.approx(0.1))

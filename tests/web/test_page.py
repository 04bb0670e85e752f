"""The page at / in a real browser (system Chromium through Playwright) against a real uvicorn server.

What a user does: open a shared link, read the ranked table, compare it with what the API says, get
an error next to the field they got wrong, copy the launch command, and see the scaling view; and what
the page must never do: reach another origin, or log an error to the console.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = "/?model=llama3-70b&cluster=eos&gpus=256&global_batch_size=512&stack=megatron-core"
QUESTION = {"model": {"preset": "llama3-70b"}, "cluster": {"preset": "eos", "num_gpus": 256},
            "training": {"global_batch_size": 512, "dtype": "bf16", "stack": "megatron-core"}}


def _open(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-done='1']")


def _rest(web_server, body: dict) -> dict:
    r = httpx.post(f"{web_server.url}/v1/recommend", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_shared_url_fills_the_form_and_renders_the_rest_answer(page, web_server):
    _open(page, SHARED)
    for name, value in (("model", "llama3-70b"), ("cluster", "eos"), ("gpus", "256"),
                        ("global_batch_size", "512"), ("stack", "megatron-core")):
        assert page.input_value(f"[name={name}]") == value
    assert page.locator("#question button[type=submit]").count() == 1
    rest = _rest(web_server, QUESTION)
    rows = page.locator("#ranked tbody tr")
    assert rows.count() == len(rest["candidates"]) == 10
    for i, cand in enumerate(rest["candidates"]):
        row = rows.nth(i)
        pred = cand["prediction"]
        step = row.locator("td.step")
        # the exact number the API gave, and the text a user reads
        assert float(step.get_attribute("data-value")) == pred["iteration_time_s"]
        assert step.inner_text().strip() == f"{pred['iteration_time_s']:.3f}"
        cells = row.locator("td")
        assert cells.nth(0).inner_text().strip() == str(cand["rank"])
        assert cells.nth(7).inner_text().strip() == f"{pred['tokens_per_s']:,.0f}"
        assert cells.nth(8).inner_text().strip() == f"{100 * pred['mfu']:.1f}%"
        plan = cand["plan"]
        megatron = cells.nth(1).inner_text()
        assert f"TP {plan['G_intra_r']}" in megatron and f"PP {plan['G_inter']}" in megatron
        assert f"DP {plan['G_data']}" in megatron and f"MBS {plan['micro_batch_size']}" in megatron
        grid = " x ".join(str(plan[k]) for k in ("G_data", "G_inter", "G_intra_d", "G_intra_r", "G_intra_c"))
        assert cells.nth(2).inner_text().startswith(grid)
        assert f"{pred['memory']['per_gpu_gib']:.1f} / {pred['memory']['capacity_gib']:g} GiB" in \
            cells.nth(10).inner_text()
    best = rest["best"]["prediction"]["iteration_time_s"]
    assert float(rows.first.locator("td.step").get_attribute("data-value")) == best
    # one time bar and one memory bar (with the capacity line) per candidate, as SVG
    assert page.locator("#ranked tbody svg.bar").count() == 2 * len(rest["candidates"])
    assert page.locator("#ranked tbody line.capacity").count() == len(rest["candidates"])
    # the rejection reasons are the API's, with their counts
    pruned = page.locator("#pruned tbody tr")
    assert pruned.count() == len(rest["pruned"])
    shown = {pruned.nth(i).locator("td").nth(1).inner_text(): pruned.nth(i).locator("td").nth(0).inner_text()
             for i in range(pruned.count())}
    assert shown == {k: f"{v:,}" for k, v in rest["pruned"].items()}
    # the launch command is the API's, byte for byte
    assert page.locator("pre.launch[data-kind=megatron]").inner_text() == rest["launch"]["megatron"]["text"]
    assert page.console_errors == []


def test_time_bar_segments_add_up_to_the_step(page, web_server):
    _open(page, SHARED)
    rest = _rest(web_server, QUESTION)
    label = page.locator("#ranked tbody tr").first.locator("svg.bar").first.get_attribute("aria-label")
    parts = [float(x) for x in re.findall(r" ([0-9.]+) s", label.split(": ", 1)[1])]
    assert sum(parts) == pytest.approx(rest["best"]["prediction"]["iteration_time_s"], abs=0.01)


def test_scaling_view_is_the_best_plan_per_gpu_count(page, web_server):
    _open(page, SHARED)
    assert page.locator("#scaling-chart").count() == 1
    rows = page.locator("#scaling-table tbody tr")
    assert rows.count() == 5
    for i, gpus in enumerate((64, 128, 256, 512, 1024)):
        cells = rows.nth(i).locator("td")
        assert cells.nth(0).inner_text() == f"{gpus:,}"
        body = {**QUESTION, "cluster": {"preset": "eos", "num_gpus": gpus}, "top_k": 1}
        rest = _rest(web_server, body)
        assert cells.nth(1).inner_text() == f"{rest['best']['prediction']['iteration_time_s']:.3f}"
    assert page.locator("#scaling-chart circle.dot").count() == 5


TRAINING = {"global_batch_size": 512, "dtype": "bf16"}
EOS = {"preset": "eos", "num_gpus": 256}
BAD = [  # (query, the field whose error it is, a word of the message, the same question over REST)
    ("model=llama3-7&cluster=eos&gpus=256&global_batch_size=512", "model", "did you mean 'llama3-70b'",
     {"model": {"preset": "llama3-7"}, "cluster": EOS, "training": TRAINING}),
    ("model=llama3-70b&cluster=eos&gpus=-8&global_batch_size=512", "gpus", "-8",
     {"model": {"preset": "llama3-70b"}, "cluster": {"preset": "eos", "num_gpus": -8}, "training": TRAINING}),
    ("model=llama3-70b&cluster=eos&gpus=256&global_batch_size=512&stack=megatron", "stack", "megatron-core",
     {"model": {"preset": "llama3-70b"}, "cluster": EOS, "training": {**TRAINING, "stack": "megatron"}}),
    ("model_json=%7B%22num_layers%22%3A+32%7D&cluster=eos&gpus=256&global_batch_size=512", "model_json",
     "model is missing hidden_size, num_attention_heads, seq_length, vocab_size",
     {"model": {"num_layers": 32}, "cluster": EOS, "training": TRAINING}),
    ("model=llama3-70b&cluster=selen&gpus=256&global_batch_size=512", "cluster", "did you mean 'selene'",
     {"model": {"preset": "llama3-70b"}, "cluster": {"preset": "selen", "num_gpus": 256},
      "training": TRAINING}),
]


@pytest.mark.parametrize(("query", "field", "needle", "body"), BAD)
def test_bad_input_shows_the_422_next_to_its_field(page, web_server, query, field, needle, body):
    _open(page, "/?" + query)
    error = page.locator(f".error[data-for={field}]")
    assert needle in error.inner_text()
    assert "invalid" in (page.locator(f"[name={field}]").get_attribute("class") or "")
    assert page.locator("#results").is_hidden()
    # the message is the service's own
    r = httpx.post(f"{web_server.url}/v1/recommend", json=body, timeout=60)
    assert r.status_code == 422
    assert r.json()["detail"][0]["msg"] in error.inner_text()
    # the console only has the browser's own line for the 422 response
    assert all("422" in line for line in page.console_errors), page.console_errors


def test_pins_that_leave_nothing_say_why_next_to_the_pins(page, web_server):
    _open(page, "/?model=llama3-70b&gpu=H100&gpus=256&global_batch_size=512&stack=megatron-core&pins=tp%3D3")
    assert "G_intra_r=3: no grid of 256 GPUs has it (3 does not divide 256)" in \
        page.locator(".error[data-for=pins]").inner_text()
    assert page.locator("#ranked tbody tr").count() == 0
    rule = page.locator("#pruned tbody tr").first.locator("td").nth(1)
    assert rule.inner_text() == "excluded by the search pins"
    assert page.console_errors == []


def test_the_form_asks_and_the_url_carries_the_question(page, web_server):
    _open(page, "/")
    assert page.locator("#results").is_hidden()
    page.fill("[name=model]", "llama3-8b")
    page.fill("[name=gpu]", "H100")
    page.fill("[name=gpus]", "64")
    page.fill("[name=global_batch_size]", "256")
    page.select_option("[name=stack]", "megatron-core")
    page.fill("[name=pins]", "tp=2,4 pp=1")
    page.click("#question button[type=submit]")
    page.wait_for_selector("body[data-done='1']")
    query = parse_qs(urlsplit(page.url).query)
    assert query == {"model": ["llama3-8b"], "gpu": ["H100"], "gpus": ["64"], "global_batch_size": ["256"],
                     "stack": ["megatron-core"], "dtype": ["bf16"], "pins": ["tp=2,4 pp=1"]}
    training = {"global_batch_size": 256, "dtype": "bf16", "stack": "megatron-core"}
    rest = _rest(web_server, {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "H100", "num_gpus": 64},
                              "training": training, "search": {"tp": [2, 4], "pp": [1]}})
    first = page.locator("#ranked tbody tr").first
    assert float(first.locator("td.step").get_attribute("data-value")) == \
        rest["best"]["prediction"]["iteration_time_s"]
    for i in range(page.locator("#ranked tbody tr").count()):
        text = page.locator("#ranked tbody tr").nth(i).locator("td").nth(1).inner_text()
        assert re.search(r"TP [24] · PP 1 ·", text), text
    # opening the shared link again gives the same table
    page2 = page.context.new_page()
    page2.goto(page.url)
    page2.wait_for_selector("body[data-done='1']")
    assert page2.locator("#ranked tbody tr").first.locator("td.step").get_attribute("data-value") == \
        first.locator("td.step").get_attribute("data-value")
    assert page.console_errors == []


def rest_launch_text(web_server) -> str:
    return _rest(web_server, QUESTION)["launch"]["megatron"]["text"]


def test_copy_button_copies_the_launch_command(page, web_server):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=web_server.url)
    _open(page, SHARED)
    page.click("button.copy[data-kind=megatron]")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == page.locator("pre.launch[data-kind=megatron]").inner_text()
    assert copied == rest_launch_text(web_server) and "--tensor-model-parallel-size" in copied


def test_no_request_leaves_the_origin(page, web_server):
    seen: list[str] = []

    def guard(route):
        seen.append(route.request.url)
        if route.request.url.startswith(web_server.url + "/"):
            route.continue_()
        else:
            route.abort()

    page.route("**/*", guard)
    _open(page, SHARED)
    assert page.locator("#ranked tbody tr").count() == 10
    assert seen, "the route guard saw no request"
    outside = [u for u in seen + page.requests if not u.startswith(web_server.url + "/")]
    assert outside == []
    # the page, its script and style, the presets, one search per GPU count of the scaling view
    assert {urlsplit(u).path for u in seen} >= {"/", "/web/app.js", "/web/app.css", "/v1/presets",
                                                 "/v1/recommend"}
    assert page.console_errors == []
    # and the browser is told to refuse any other origin
    csp = httpx.get(web_server.url + "/").headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "script-src 'self'" in csp


def test_screenshot_for_the_readme(page, tmp_path):
    """Writes the README's picture (docs/page.png when GRIDTUNE_UPDATE_SCREENSHOT=1, else a temp file)."""
    _open(page, SHARED)
    update = os.environ.get("GRIDTUNE_UPDATE_SCREENSHOT") == "1"
    out = ROOT / "docs" / "page.png" if update else tmp_path / "page.png"
    page.screenshot(path=str(out), full_page=True)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width == 1400 and height > 1000
    assert page.console_errors == []

"""`specdec generate`, `demo`, `predict` and `bench` on the embedded SmolLM2,
kept short (a few tokens, one prompt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from specdec_rs.cli import main

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


def test_generate_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", "Rewrite: def f(x): return x+1", "--max-new-tokens", "12", "--json"]
    assert main([*args, "--drafter", "prompt-lookup", "--temperature", "0"]) == 0
    r = json.loads(capsys.readouterr().out)
    keys = {"text", "new_tokens", "tokens_per_second", "tokens_per_pass", "alpha", "rounds"}
    assert keys | {"drafter", "k", "temperature"} <= set(r)
    assert r["drafter"] == "prompt-lookup" and r["temperature"] == 0 and 1 <= r["new_tokens"] <= 12
    assert main([*args, "--drafter", "none", "--temperature", "0"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["text"] == r["text"] and plain["tokens_per_pass"] == 1.0


def test_generate_rejects_a_bad_drafter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "hi", "--drafter", "early-exit:99"]) == 2
    assert "num_layers = 99 is out of range" in capsys.readouterr().err


def test_demo_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--prompts", "1", "--max-new-tokens", "6", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert [row["drafter"] for row in r["rows"]][0] == "none"
    assert r["rows"][0]["speedup"] == 1.0 and len(r["rows"]) == 4


def test_predict_and_bench(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--prompts", "1", "--max-new-tokens", "12", "--k-max", "3", "--workloads", "code"]
    common += ["--temperatures", "0", "--drafters", "prompt-lookup", "--json"]
    assert main(["predict", *common]) == 0
    r = json.loads(capsys.readouterr().out)
    (res,) = r["results"]
    assert len(r["costs"]["verify_cost"]) == 4 and r["costs"]["verify_cost"][0] == 1.0
    assert 0 <= res["alpha"] <= 1 and len(res["prediction"]["speedup_refined"]) == 3
    out = tmp_path / "bench"
    assert main(["bench", *common, "--out", str(out), "--no-transformers"]) == 0
    b = json.loads(capsys.readouterr().out)
    methods = {row["method"] for row in b["rows"]}
    assert {"target-only", "k=1", "k=2", "adaptive", "heuristic"} <= methods
    assert (out / "speedup.png").stat().st_size > 10_000
    assert "| prompt-lookup | k=2 |" in (out / "report.md").read_text()

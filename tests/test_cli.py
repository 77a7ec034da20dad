"""The `specdec` command: JSON output that agrees with the library, errors as exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import specdec_rs as sd
from specdec_rs.cli import main


def test_simulate_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--runs", "30000", "--k", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["pairs"]["tv"] < 0.015
    assert r["round_lengths"]["theory"] == pytest.approx(sd.expected_tokens(0.8, 2))
    assert r["round_lengths"]["mean"] == pytest.approx(r["round_lengths"]["theory"], rel=0.02)
    assert sum(r["round_lengths"]["counts"]) == 30000


def test_simulate_with_a_bug_shows_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--runs", "30000", "--variant", "resample_from_p", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pairs"]["tv"] > 0.1


def test_theory_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["theory", "--alpha", "0.6", "0.8", "--cost", "0.32", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["best"]["0.8"]["k"] == 3 and r["best"]["0.6"]["k"] == 1
    assert r["table"][3]["0.8"]["tokens"] == pytest.approx(3.3616)


def test_bad_arguments_exit_2_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--k", "-1"]) == 2
    assert "k = -1 is out of range" in capsys.readouterr().err


def test_module_entry_point_prints_tables() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "specdec_rs", "simulate", "--runs", "20000"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "TV distance" in out and "tokens per target pass" in out


def test_theory_plot_and_experiments_write_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "theory.png"
    assert main(["theory", "--alpha", "0.6", "0.8", "--cost", "0.05", "--plot", str(png)]) == 0
    assert png.stat().st_size > 10_000
    capsys.readouterr()
    assert main(["experiments", "--out", str(tmp_path / "exp"), "--seed", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["seed"] == 3 and set(r) >= {
        "noise_vs_bias",
        "non_iid",
        "temperature",
        "greedy_drafter",
    }
    assert "(seed 3)" in (tmp_path / "exp" / "report.md").read_text()

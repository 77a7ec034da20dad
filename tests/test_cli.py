"""The `specdec` command without a model: JSON that agrees with the library,
the human-readable output of every subcommand, and every error path as one
line on stderr with exit code 2 (1 for a failed write, 130 for Ctrl-C)."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import specdec_rs as sd
from specdec_rs.cli import main


def one_line_error(err: str, *fragments: str) -> None:
    """stderr holds exactly one line, an error naming each fragment, no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "error:" in lines[0] and "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


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
    assert r["alphas"] == [0.6, 0.8] and r["best_k"] == [1, 3]
    assert r["rows"][3]["k"] == 4 and r["rows"][3]["tokens"][1] == pytest.approx(3.3616)


def test_module_entry_point_prints_tables() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "specdec_rs", "simulate", "--runs", "20000"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "TV distance" in out and "tokens per target pass" in out


def test_theory_human_output_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "theory.png"
    assert main(["theory", "--alpha", "0.6", "0.8", "--cost", "0.05", "--plot", str(png)]) == 0
    assert png.stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "Tokens per target pass and speedup" in out and "best γ = 8" in out
    assert main(["theory", "--alpha", "0.3", "--cost", "0.9", "--k-max", "1000"]) == 0
    assert "speculation does not pay" in capsys.readouterr().out


def test_experiments_human_output_and_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The report printed, the figures and results.json written; the numbers
    behave as the handout's experiments say they must."""
    out_dir = tmp_path / "exp"
    assert main(["experiments", "--out", str(out_dir), "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    report = (out_dir / "report.md").read_text()
    assert "(seed 3)" in report and "## 4. Greedy drafter" in printed
    for name in ("noise_vs_bias", "non_iid", "temperature", "greedy_drafter"):
        assert (out_dir / f"{name}.png").stat().st_size > 10_000
    assert f"written to {out_dir}" in printed.replace("\n", "")
    r = json.loads((out_dir / "results.json").read_text())
    tv = r["noise_vs_bias"]["tv"]
    assert tv["exact"][-1] < 0.01 < tv["exact"][0] * 10  # noise shrinks with n
    for variant in ("resample_from_p", "continue_after_reject", "inverted_ratio", "greedy_check"):
        assert tv[variant][-1] > 0.1
    ni = r["non_iid"]
    for measured, per_pos in zip(ni["measured"], ni["per_position"], strict=True):
        assert abs(measured - per_pos) < 0.002 * measured
    for c in r["temperature"]["curves"].values():
        assert c["alpha"][0] == pytest.approx(c["argmax_agreement"], abs=0.06)
        assert c["alpha"][-1] > 0.95
    greedy = r["greedy_drafter"]["results"]
    assert greedy["one-hot q (correct)"]["chi2_pvalue"] > 1e-6
    assert greedy["softmax q (bug)"]["chi2_pvalue"] < 1e-6


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["simulate", "--k", "-1"], ["k = -1 is out of range"]),
        (["simulate", "--k", "abc"], ["--k", "invalid int value"]),
        (["simulate", "--runs", "0"], ["runs = 0"]),
        (["simulate", "--threads", "100000"], ["threads = 100000"]),
        (["simulate", "--variant", "fast"], ["invalid choice"]),
        (["theory", "--alpha", "2"], ["alpha = 2.0"]),
        (["simulate", "--dtype", "float32"], ["unrecognized arguments"]),
        (["theory", "--cost", "nan"], ["cost_ratio = nan"]),
        (["theory", "--k-max", "100000000"], ["--k-max = 100000000", "<= 1000"]),
        (["theory", "--k-max", "0"], ["k_max = 0 is out of range"]),
        (["theory", "--plot", "/nonexistent/x.png"], ["--plot", "does not exist"]),
        (["theory", "--alpha"], ["--alpha", "expected at least one"]),
        (["experiments", "--seed", "-3"], ["seed = -3"]),
        (["frobnicate"], ["invalid choice"]),
        ([], ["required"]),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code  # type: ignore[assignment]
    assert code == 2
    one_line_error(capsys.readouterr().err, *fragments)


def test_output_paths_that_are_files_or_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    assert main(["experiments", "--out", str(a_file)]) == 2
    one_line_error(capsys.readouterr().err, "--out", "is a file")
    assert main(["theory", "--plot", str(tmp_path)]) == 2
    one_line_error(capsys.readouterr().err, "--plot", "is a folder")


def test_ctrl_c_stops_a_long_simulation_within_a_second() -> None:
    """SIGINT during Rust work: the engine polls for signals every 50 ms."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdec_rs", "simulate", "--runs", "10000000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a child of a non-interactive shell may inherit SIGINT ignored; restore it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    assert proc.stderr.readline().startswith("simulating")  # imports done, however slow
    time.sleep(0.3)  # the simulation running
    assert proc.poll() is None
    sent = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.perf_counter() - sent < 1.0
    assert proc.returncode == 130
    assert err.strip() == "specdec: interrupted"


def test_keyboard_interrupt_reaches_python_callers() -> None:
    code = (
        "import signal, threading, specdec_rs as sd\n"
        "from conftest import P_TABLE as P\n"
        "threading.Timer(1.0, signal.raise_signal, (signal.SIGINT,)).start()\n"
        "try:\n"
        "    sd.simulate_round_lengths(P, P, k=2, rounds=10**13)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).parent,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert out.stdout.strip() == "interrupted", out.stderr


def test_the_collector_pauses_while_a_model_loads_and_resumes() -> None:
    """`flags.collector_paused` (around every model load): paused inside,
    resumed after (a failed load too), nothing frozen in a program calling
    main(argv); a collector the caller turned off stays off."""
    from specdec_rs.cli.flags import collector_paused

    frozen = gc.get_freeze_count()
    with pytest.raises(ValueError, match="a failed load"):
        with collector_paused(freeze=False):
            assert not gc.isenabled()
            raise ValueError("a failed load")
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    gc.disable()
    try:
        with collector_paused(freeze=False):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_command_freezes_what_it_loaded_and_exits_clean() -> None:
    """In the command's own process the loaded objects leave the collector's
    way (frozen), and are unfrozen at exit: nothing printed, status 0."""
    code = (
        "import gc\n"
        "from specdec_rs.cli.flags import collector_paused\n"
        "with collector_paused(freeze=True):\n"
        "    kept = [[i] for i in range(5000)]\n"
        "assert gc.isenabled() and gc.get_freeze_count() >= 5000, gc.get_freeze_count()\n"
        "print('frozen')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "frozen", ""), out.stderr


def test_ctrl_c_during_the_imports_stops_quietly() -> None:
    """An interrupt while the subcommands import (the first few tenths of a
    second) once printed a KeyboardInterrupt traceback."""
    code = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'specdec_rs.cli.toy':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from specdec_rs.cli import main\n"
        "sys.exit(main(['theory']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 130 and out.stderr.strip() == "specdec: interrupted", out.stderr


def test_importing_the_package_and_the_command_loads_no_numpy() -> None:
    """The names load on first use, so the command's Ctrl-C handler is in
    place before any heavy import; the names still resolve, and the
    functions that share their modules' names stay functions."""
    code = (
        "import sys, specdec_rs, specdec_rs.cli\n"
        "assert 'numpy' not in sys.modules, 'numpy'\n"
        "import specdec_rs.generation, specdec_rs.verify\n"
        "assert callable(specdec_rs.generate) and callable(specdec_rs.verify)\n"
        "assert specdec_rs.generate.__module__ == 'specdec_rs.generation.loop'\n"
        "from specdec_rs import verify, drafters, PromptLookup\n"
        "assert verify is specdec_rs.verify and drafters.PromptLookup is PromptLookup\n"
        "print(len(dir(specdec_rs)) > 40)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr


def test_the_package_names_are_listed_alike_for_the_lazy_table_and_the_type_checkers() -> None:
    """specdec_rs/__init__.py lists its names three times (the lazy table,
    the imports type checkers read, __all__): each name in each list comes
    from the same module, and each resolves."""
    import ast

    tree = ast.parse(Path(sd.__file__).read_text(encoding="utf-8"))
    guarded = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    typed = {
        alias.name: node.module
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == sd._HOME
    assert sorted(sd.__all__) == sorted(sd._HOME)
    assert all(getattr(sd, name) is not None for name in sd.__all__)


def test_tables_keep_whole_names_when_stdout_is_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Into a pipe or a file rich would cut lines at 80 columns, names in
    table cells included ("transformers.genera…")."""
    import io

    from specdec_rs.cli.show import make_console, table

    monkeypatch.delenv("COLUMNS", raising=False)
    name = "transformers.generation.candidate_generator (assisted, sampling)"
    out = io.StringIO()
    console = make_console(out)
    console.print(table("an audit", ["verifier", "case", "verdict"], [[name, "dense", "ok"]]))
    console.print("a sentence " * 12)
    text = out.getvalue()
    assert name in text and "…" not in text
    assert ("a sentence " * 12).strip() in text  # one line, not wrapped at 80 columns

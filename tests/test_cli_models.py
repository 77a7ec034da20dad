"""`specdec generate`, `demo`, `predict` and `bench` on the embedded SmolLM2,
kept short (a few tokens, one prompt): the JSON keys, the human-readable
output for every drafter (including none), and the error paths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from specdec_rs import models
from specdec_rs.cli import main
from specdec_rs.prompts import workloads
from test_cli import one_line_error

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

PROMPT = "Rewrite: def f(x): return x+1"
SPECDEC = {"engine": "specdec", "policy": "fixed"}


def test_generate_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", PROMPT, "--max-new-tokens", "6", "--json"]
    assert main([*args, "--drafter", "prompt-lookup", "--temperature", "0"]) == 0
    r = json.loads(capsys.readouterr().out)
    keys = {"text", "new_tokens", "tokens_per_second", "tokens_per_pass", "alpha", "rounds"}
    assert keys | {"drafter", "k", "temperature"} <= set(r)
    assert r["drafter"] == "prompt-lookup" and r["temperature"] == 0 and 1 <= r["new_tokens"] <= 6
    assert main([*args, "--drafter", "none", "--temperature", "0"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["text"] == r["text"] and plain["tokens_per_pass"] == 1.0
    assert plain["alpha"] is None  # nothing drafted: α undefined, JSON null
    # behind a confidence gate the head's greedy output is still the target's
    assert main([*args, "--drafter", "eagle", "--k", "3", "--draft-confidence", "0.3"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == plain["text"]


def test_the_suffix_drafters_greedy_text_is_target_onlys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the CLI on SmolLM2, one prompt and a file of prompts (one
    drafter object: its global index learns across them, with or without --batch)."""
    args = ["generate", PROMPT, "--max-new-tokens", "24", "--json", "--temperature", "0"]
    assert main([*args, "--drafter", "suffix"]) == 0
    assert main([*args, "--drafter", "none"]) == 0
    suffix, plain = (json.loads(x) for x in capsys.readouterr().out.strip().splitlines())
    assert suffix["text"] == plain["text"] and suffix["drafter"] == "suffix"
    file = tmp_path / "prompts.txt"
    file.write_text(f"{PROMPT}\n{PROMPT} Keep the name f.\n{PROMPT}\n")
    many = ["generate", "--prompts-file", str(file), "--max-new-tokens", "24", "--json"]
    many += ["--temperature", "0"]
    texts = {}
    for extra in (
        ["--drafter", "none"],
        ["--drafter", "suffix"],
        ["--drafter", "suffix", "--batch", "2"],
    ):
        assert main([*many, *extra]) == 0
        texts[" ".join(extra)] = [r["text"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert len(set(map(tuple, texts.values()))) == 1, texts


def test_the_lookahead_drafters_greedy_text_is_target_onlys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Through the CLI on SmolLM2: chains at the default W,N,G and a trie
    of another shape, each with its Jacobi window in the verification forward."""
    args = ["generate", PROMPT, "--max-new-tokens", "24", "--json", "--temperature", "0"]
    assert main([*args, "--drafter", "none"]) == 0
    assert main([*args, "--drafter", "lookahead", "--k", "2"]) == 0
    assert main([*args, "--drafter", "lookahead:3,3,2", "--tree", "4"]) == 0
    plain, chain, tree = (json.loads(x) for x in capsys.readouterr().out.strip().splitlines())
    assert chain["text"] == plain["text"] and chain["drafter"] == "lookahead"
    assert tree["text"] == plain["text"] and tree["drafter"] == "lookahead:3,3,2"
    assert chain["drafted"] > 0 and tree["drafted"] > 0


DRAFTERS = [
    "none",
    "prompt-lookup",
    "suffix",
    "lookahead",
    "early-exit:4",
    "truncated:2",
    "model:SMOLLM2",
    "eagle",
    "medusa",
    "hybrid",
]


@pytest.fixture(scope="module")
def smollm2_float32() -> None:
    """The float32 SmolLM2 folder `model:SMOLLM2` names, converted here
    when no earlier test made it (outside the test's captured output)."""
    models.load_smollm2(weights="float32")


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_generate_human_output_for_every_drafter(
    drafter: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    smollm2_float32: None,
) -> None:
    """The text, then the statistics table; α shown as "-" when undefined."""
    monkeypatch.setenv("COLUMNS", "160")  # rich's width when not on a terminal
    drafter = drafter.replace("SMOLLM2", str(models.cache_dir() / models.SMOLLM2_NAME))
    argv = ["generate", PROMPT, "--max-new-tokens", "4", "--k", "2", "--drafter", drafter]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "tokens/s" in captured.out and "target passes" in captured.out
    assert f"drafter {drafter}, k = {0 if drafter == 'none' else 2}" in captured.out
    if drafter == "none":
        table_row = next(line for line in captured.out.splitlines() if line.startswith("│"))
        assert [c.strip() for c in table_row.split("│")][5] == "-"  # α undefined
    else:
        assert "acceptance by draft position" in captured.out


def test_demo_human_output(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["demo", "--prompts", "1", "--max-new-tokens", "2", "--temperature", "0.7"]) == 0
    out = capsys.readouterr().out
    rows = {
        cells[0]: cells
        for line in out.splitlines()
        if len(cells := [c.strip() for c in line.split("│")[1:-1]]) == 6
    }
    assert {
        "none",
        "prompt-lookup",
        "eagle",
        "medusa",
        "hybrid",
        "early-exit:24",
        "truncated:24",
    } <= set(rows)
    assert rows["none"][5] == "1.00x" and rows["none"][4] == "-"  # α undefined


@pytest.fixture(scope="module")
def copying_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local model folder: a 2-layer random Llama over SmolLM2's tokenizer
    whose LM head is its embedding (scaled), so greedy decoding repeats the
    last token and prompt lookup's drafts are accepted. predict and bench
    measure any target; this one takes milliseconds a step."""
    import torch

    folder = tmp_path_factory.mktemp("copying-model")
    _, tokenizer = models.load_smollm2()
    model = models.tiny_llama(vocab_size=len(tokenizer), hidden_size=64, num_layers=2, seed=0)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight * 50)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_predict_and_bench(
    copying_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--model", str(copying_model), "--prompts", "1", "--max-new-tokens", "8"]
    common += ["--k-max", "3", "--workloads", "chat", "--temperatures", "0"]
    common += ["--drafters", "prompt-lookup", "--repeats", "3"]
    assert main(["predict", *common]) == 0
    assert "prompt-lookup on chat, temperature 0: α = 1.000" in capsys.readouterr().out
    out = tmp_path / "bench"
    assert main(["bench", *common, "--out", str(out), "--no-transformers"]) == 0
    printed = capsys.readouterr().out
    assert "| prompt-lookup | k=2 |" in printed and "| none | target-only |" in printed
    assert (out / "speedup.png").stat().st_size > 10_000
    b = json.loads((out / "results.json").read_text())
    assert len(b["costs"]["verify_cost"]) == 4 and b["costs"]["verify_cost"][0] == 1.0
    (res,) = b["predictions"]["results"]
    assert res["alpha"] == 1.0 and len(res["forecast"]["speedup_refined"]) == 3
    methods = {(r["totals"]["method"]["policy"], r["totals"]["method"]["k"]) for r in b["rows"]}
    assert {("none", None), ("fixed", 1), ("fixed", 2), ("adaptive", None)} <= methods
    base = next(r for r in b["rows"] if r["totals"]["method"]["policy"] == "none")
    k2 = next(r for r in b["rows"] if r["totals"]["method"] == {**SPECDEC, "k": 2})
    assert base["alpha"] is None and k2["alpha"] == 1.0 and k2["totals"]["checked"] > 0
    rate = k2["totals"]["tokens"] / k2["totals"]["seconds"]
    assert k2["tokens_per_second"] == pytest.approx(rate)
    assert k2["speedup"] == pytest.approx(rate / base["tokens_per_second"])
    assert k2["predicted"] is not None and base["predicted"] is None


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["generate", "hi", "--drafter", "early-exit:99"], ["num_layers = 99 is out of range"]),
        (["generate", "hi", "--drafter", "early-exit:x"], ["drafter 'early-exit:x'"]),
        (["generate", "hi", "--dtype", "float8"], ["dtype = 'float8'"]),
        (["generate", "hi", "--device", "cuda:7"], ["device = 'cuda:7'"]),
        (["generate", "hi", "--drafter", "model:/nonexistent"], ["/nonexistent is not a folder"]),
        (["generate", "hi", "--k", "0"], ["k = 0 is out of range"]),
        (["generate", "hi", "--draft-confidence", "1"], ["--draft-confidence = 1.0"]),
        (["generate", "hi", "--draft-confidence", "0.3"], ["'prompt-lookup' has no confidence"]),
        (["generate", "hi", "--top-p", "2"], ["top_p = 2.0"]),
        (["generate", "hi", "--temperature", "nan"], ["temperature = nan"]),
        (["generate", "hi", "--max-new-tokens", "9000"], ["past the model's context of 8192"]),
        (["generate", "hi", "--model", "/nonexistent"], ["/nonexistent is not a folder"]),
        (["demo", "--prompts", "0"], ["--prompts = 0 is out of range"]),
        (["demo", "--prompts", "41"], ["--prompts = 41", "<= 40"]),
        (["predict", "--prompts", "-1"], ["--prompts = -1 is out of range"]),
        (["predict", "--drafters", "none"], ["target-only, which is always measured"]),
        (["predict", "--k-max", "0"], ["--k-max = 0"]),
        (["bench", "--workloads", "poems"], ["--workloads = 'poems'"]),
        (["bench", "--out", "/proc/version"], ["--out", "is a file"]),
        (["generate", "hi", "--k", "2000"], ["--k = 2000", "<= 1024"]),
        (["generate", "hi", "--max-new-tokens", str(2**21)], ["--max-new-tokens = 2097152"]),
        (["generate", "caf\udce9"], ["the prompt is not UTF-8 text", "b'\\xe9'"]),
        (
            ["generate", "hi", "--drafter", "eagle", "--tree", "4", "--draft-confidence", "0.3"],
            ["--draft-confidence gates chains only"],
        ),
        (["train-drafter", "--epochs", "0"], ["--epochs = 0.0 is out of range"]),
        (["train-drafter", "--train-batch-size", "0"], ["--train-batch-size = 0"]),
        (["train-drafter", "--batch-size", "5000"], ["--batch-size = 5000", "<= 4096"]),
        (["train-drafter", "--lr", "1e30"], ["--lr = 1e+30 is out of range"]),
        (["train-drafter", "--medusa-heads", "300000"], ["--medusa-heads = 300000"]),
        (["train-drafter", "--draft-vocab", "-1"], ["--draft-vocab = -1"]),
        (["train-drafter", "--out", ""], ["--out = ''; expected a file name"]),
        (["train-drafter", "--prompts-file", "/nonexistent"], ["is not a file"]),
        (["generate"], ["give a prompt or --prompts-file F"]),
        (["generate", "hi", "--prompts-file", "p.jsonl"], ["give a prompt or --prompts-file F"]),
        (["generate", "--prompts-file", "/nonexistent"], ["is not a file"]),
        (["generate", "hi", "--json-schema", "/nonexistent"], ["--json-schema file is missing"]),
        (["generate", "hi", "--regex", "("], ["regex is not supported", "unclosed group"]),
        (["generate", "hi", "--choice", "a,,b"], ["choice option 1"]),
    ],
)
def test_model_commands_fail_with_one_line(
    argv: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    one_line_error(capsys.readouterr().err, *fragments)


def test_generate_follows_a_json_schema_or_a_choice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}},
        "required": ["name"],
        "additionalProperties": False,
    }
    file = tmp_path / "schema.json"
    file.write_text(json.dumps(schema))
    args = ["generate", "Give a name as JSON.", "--max-new-tokens", "24", "--json"]
    assert main([*args, "--temperature", "0", "--json-schema", str(file)]) == 0
    none = ["--drafter", "none"]
    assert main([*args, "--temperature", "0", "--json-schema", str(file), *none]) == 0
    lookup, plain = (json.loads(x) for x in capsys.readouterr().out.strip().splitlines())
    assert lookup["text"] == plain["text"] and lookup["grammar_accepting"]
    assert set(json.loads(lookup["text"])) == {"name"} and lookup["forced"] > 0
    assert main([*args, "--choice", "yes,no", "--temperature", "0.7"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] in ("yes", "no")


def test_linear_flag_takes_its_three_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "hi", "--linear", "mkl"])
    assert exit_.value.code == 2
    one_line_error(capsys.readouterr().err, "--linear", "invalid choice: 'mkl'")


TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a bird."}]


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_train_drafter_end_to_end(
    kind: str, copying_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`specdec train-drafter` on a small local target: data, training and the
    head file in one command; the head then drafts through `generate` with the
    target's greedy output, and is refused by another target. The Medusa run
    trains on a prompts file of its own (five prompts, the first four taken)."""
    head = tmp_path / f"{kind}.safetensors"
    argv = ["train-drafter", "--kind", kind, "--model", str(copying_model), "--json"]
    argv += ["--data", str(tmp_path / "data"), "--out", str(head), "--prompts", "4"]
    if kind == "medusa":
        mine = tmp_path / "mine.jsonl"
        lines: list[dict[str, Any]] = [
            {"messages": TURNS + [{"role": "assistant", "content": "Owl."}]}
        ]
        lines += [{"prompt": f"Tell me about {w}.\nBriefly."} for w in ("owls", "ink")]
        mine.write_text("\n".join(json.dumps(x) for x in lines) + '\n"Why?"\n\n"And now?"\n')
        argv += ["--prompts-file", str(mine)]
    argv += ["--max-new-tokens", "6", "--batch-size", "4", "--epochs", "1"]
    argv += ["--train-batch-size", "4", "--draft-vocab", "64"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["result"]["path"] == str(head) and head.stat().st_size > 0
    # N most frequent answer tokens: this target repeats its last token, so fewer than 64 occur
    assert 1 <= report["result"]["draft_vocab"] <= 64 and report["result"]["steps"] > 0
    answers = report["result"]["train_sequences"] + report["result"]["holdout_sequences"]
    assert 1 <= answers <= 4  # prompts over max_prompt_tokens are left out
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert ("prompts_sha256" in manifest) == (kind == "medusa")
    if kind == "medusa":  # a conversation is encoded in the chat template, up to the reply
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(copying_model)
        text = tokenizer.decode(workloads.encode(tokenizer, TURNS))
        assert "Be brief." in text and "Name a bird." in text
        assert text.endswith("<|im_start|>assistant\n")
        tokenizer.chat_template = None
        with pytest.raises(ValueError, match="chat template"):
            workloads.encode(tokenizer, TURNS)
    common = ["generate", PROMPT, "--model", str(copying_model), "--max-new-tokens", "8"]
    common += ["--temperature", "0", "--json"]
    assert main([*common, "--drafter", "none"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*common, "--drafter", f"{kind}:{head}", "--k", "2"]) == 0
    drafted = json.loads(capsys.readouterr().out)
    assert drafted["text"] == plain["text"] and drafted["drafter"] == f"{kind}:{head}"
    # torch's products instead of Rust's, for the target and its head: the same greedy text
    assert main([*common, "--drafter", f"{kind}:{head}", "--k", "2", "--linear", "torch"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == plain["text"]
    assert main(["generate", "hi", "--drafter", f"{kind}:{head}"]) == 2  # SmolLM2 is another target
    one_line_error(capsys.readouterr().err, "trained for another target")


def test_generate_runs_every_prompt_of_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--prompts-file: each prompt in turn with seed --seed + i, as the same
    prompt alone with that seed; the totals add up; --raw refuses conversations."""
    prompts = tmp_path / "prompts.jsonl"
    lines = ['{"prompt": "Say hi."}', '"Name a color."']
    prompts.write_text("\n".join([*lines, '{"messages": [{"role": "user", "content": "Why?"}]}']))
    args = ["--max-new-tokens", "5", "--temperature", "0.7", "--seed", "3", "--json"]
    assert main(["generate", "--prompts-file", str(prompts), *args]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["results"]) == 3 and out["totals"]["prompts"] == 3
    assert out["totals"]["new_tokens"] == sum(r["new_tokens"] for r in out["results"])
    assert [r["seed"] for r in out["results"]] == [3, 4, 5]
    assert main(["generate", "Name a color.", *args[:-3], "--seed", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == out["results"][1]["text"]
    assert main(["generate", "--prompts-file", str(prompts), "--raw"]) == 2
    one_line_error(capsys.readouterr().err, "--raw encodes plain text", "conversations")


def test_generate_batch_equals_the_prompts_one_by_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--batch 2 with a fixed --k: each prompt's text is the one it gets in
    the one-by-one run (prompt i with seed --seed + i; the GGUF rows are the
    same bits batched or alone); the batch's summary is there; a bad
    combination is a one-line error."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Say hi."}\n"Name a color."\n"Count to three."\n')
    args = ["--max-new-tokens", "6", "--temperature", "0.7", "--seed", "3", "--k", "2", "--json"]
    assert main(["generate", "--prompts-file", str(prompts), *args]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main(["generate", "--prompts-file", str(prompts), "--batch", "2", *args]) == 0
    batched = json.loads(capsys.readouterr().out)
    assert [r["text"] for r in batched["results"]] == [r["text"] for r in alone["results"]]
    assert batched["batch"]["batch"] == 2 and batched["batch"]["rounds"] >= 1
    assert batched["totals"]["new_tokens"] == alone["totals"]["new_tokens"]
    # --batch past the prompt count holds one row per prompt (its profile too)
    assert main(["generate", "--prompts-file", str(prompts), "--batch", "1024", *args]) == 0
    wide = json.loads(capsys.readouterr().out)
    assert wide["batch"]["batch"] == 3
    assert [r["text"] for r in wide["results"]] == [r["text"] for r in alone["results"]]
    assert main(["generate", "hi", "--batch", "2"]) == 2
    one_line_error(capsys.readouterr().err, "--batch decodes the prompts of --prompts-file")
    assert main(["generate", "--prompts-file", str(prompts), "--batch", "2", "--tree", "4"]) == 2
    one_line_error(capsys.readouterr().err, "--batch runs chains")


def test_a_gguf_draft_models_greedy_text_is_target_onlys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--drafter model:FILE.gguf`` (SmolLM2's own file as its draft: its
    tokenizer checked string by string), alone and in the batch engine."""
    draft = f"model:{models.smollm2_gguf()}"
    args = ["generate", PROMPT, "--max-new-tokens", "12", "--json", "--temperature", "0"]
    assert main([*args, "--drafter", "none"]) == 0
    assert main([*args, "--drafter", draft, "--k", "3"]) == 0
    plain, spec = (json.loads(x) for x in capsys.readouterr().out.strip().splitlines())
    assert spec["text"] == plain["text"] and spec["drafted"] > 0 and spec["alpha"] == 1.0
    file = tmp_path / "prompts.txt"
    file.write_text(f"{PROMPT}\n{PROMPT} Keep the name f.\n")
    many = ["generate", "--prompts-file", str(file), "--max-new-tokens", "12", "--json"]
    many += ["--temperature", "0", "--batch", "2", "--k", "2"]
    assert main([*many, "--drafter", draft]) == 0
    batched = [r["text"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert main([*many, "--drafter", "none"]) == 0
    assert batched == [r["text"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert batched[0] == plain["text"]

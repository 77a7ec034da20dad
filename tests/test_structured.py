"""Structured output: grammars, the per-round constraint, and constrained
generation (valid output, greedy identity with every drafter kind, forced
drafts, the errors). The output law under speculation is in
tests/test_structured_law.py. p = target, q = draft."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
import specdec_rs as sd
from grammar_fixtures import PIECES, SCHEMA, tiny_tokenizer
from specdec_rs.models import tiny_llama
from specdec_rs.structured import Grammar, GrammarDeadEnd, bind

torch = pytest.importorskip("torch")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

V = 48  # the tokenizer's 34 pieces and 14 ids it lacks (a padded LM head)
ID = {p: i for i, p in enumerate(PIECES)}


@pytest.fixture(scope="module")
def tok() -> Any:
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def models() -> tuple[Any, Any]:
    return tiny_llama(vocab_size=V, num_layers=2, seed=1), tiny_llama(
        vocab_size=V, num_layers=1, seed=2
    )


def text_of(tok: Any, tokens: list[int]) -> str:
    return str(tok.decode([t for t in tokens if t != 0]))


def drafters(target: Any, draft: Any) -> dict[str, Any]:
    return {
        "none": None,
        "prompt-lookup": sd.PromptLookup(),
        "draft-model": sd.DraftModel(draft),
        "early-exit": sd.EarlyExit(target, 1),
        "suffix": sd.SuffixDrafter(),
        "lookahead": sd.Lookahead(),
    }


# ---- grammars -----------------------------------------------------------------------------


def test_each_kind_of_grammar_is_made_and_checked() -> None:
    assert Grammar.json_schema(SCHEMA).kind == "json_schema"
    assert Grammar.json_schema(json.dumps(SCHEMA)) == Grammar.json_schema(SCHEMA)
    assert Grammar.json_object().kind == "json_object"
    assert Grammar.regex(r"[ab]+c").source == "[ab]+c"
    assert Grammar.choice(["a b#", "(x)"]).options == ["a b#", "(x)"]
    lark = Grammar.grammar('start: "yes" | "no"')
    gbnf = Grammar.grammar('root ::= "yes" | "no"')
    assert lark.kind == gbnf.kind == "grammar" and "start" in gbnf.source


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Grammar.json_schema("{bad"), "not valid JSON"),
        (lambda: Grammar.json_schema([1]), "expected a JSON object"),
        (lambda: Grammar.json_schema(False), "matches nothing"),
        (lambda: Grammar.json_schema({"type": "object", "not": {}}), '"not"'),
        (lambda: Grammar.json_schema({"type": "string", "pattern": "(?=a)b"}), "look-around"),
        # found by the fuzz: the compiler's float64 would require 2^60, not 2^60 + 1
        (lambda: Grammar.json_schema({"enum": [2**60 + 1]}), "json_schema.enum[0]"),
        (lambda: Grammar.json_schema({"type": "integer", "maximum": 2**60 + 1}), "2^53"),
        (
            lambda: Grammar.json_schema({"oneOf": [{"type": "string"}, {"maxLength": 3}]}),
            "use anyOf",
        ),
        (lambda: Grammar.regex("("), "unclosed group"),
        (lambda: Grammar.regex(""), "non-empty"),
        (lambda: Grammar.choice([]), "1 to"),
        (lambda: Grammar.choice("yes"), "list of strings"),
        (lambda: Grammar.choice(["a", ""]), "option 1"),
        (lambda: Grammar.grammar("start: foo"), "unknown name"),
        (lambda: Grammar.regex("a").options, "no options"),
    ],
)
def test_a_bad_grammar_is_a_value_error_that_names_the_problem(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_the_walk_masks_each_draft_and_settle_rolls_back_to_the_emitted_text(tok: Any) -> None:
    c = bind(Grammar.regex("(a|b)xy(a|b|c)"), tok, V, [0])
    walk = c.walk([ID["a"], ID["xy"], ID["z"], ID["a"]])
    assert (walk.consumed, walk.refused, walk.useful) == (2, 2, 3)
    assert np.flatnonzero(walk.allowed[0]).tolist() == [ID["a"], ID["b"]]
    assert np.flatnonzero(walk.allowed[1]).tolist() == [ID["xy"]]
    assert np.flatnonzero(walk.allowed[2]).tolist() == [ID["a"], ID["b"], ID["c"]]
    c.settle(walk, [ID["b"]])  # the first draft rejected, b drawn from its row
    assert c.forced(4) == [ID["xy"]]
    walk = c.walk([ID["xy"], ID["c"], ID["a"]])
    assert (walk.consumed, walk.refused) == (2, 2)  # after c only EOS
    assert np.flatnonzero(walk.allowed[2]).tolist() == [0]
    c.settle(walk, [ID["xy"], ID["c"], 0])
    assert c.accepting and c.stopped
    with pytest.raises(RuntimeError, match="not masked"):
        bad = bind(Grammar.regex("a"), tok, V, [0])
        bad.settle(bad.walk([]), [ID["b"]])


def test_an_eos_draft_is_never_consumed_so_a_rollback_across_it_is_exact(tok: Any) -> None:
    """llguidance does not count an EOS consumed once the grammar has stopped
    (after "ab" here): rolling back across one would undo "b" too."""
    c = bind(Grammar.regex("ab?"), tok, V, [0])
    walk = c.walk([ID["a"], ID["b"], 0, ID["a"]])
    assert (walk.consumed, walk.refused, walk.eos, walk.useful) == (2, None, True, 3)
    c.settle(walk, [ID["a"], 0])  # "b" rejected, EOS drawn from its row
    assert np.flatnonzero(c.mask()).tolist() == [0, ID["b"]]  # the state after "a"
    walk = c.walk([ID["b"], 0])
    c.settle(walk, [ID["b"], 0, ID["z"]])  # both kept; the bonus after EOS is never read
    assert c.accepting


# ---- constrained generation -----------------------------------------------------------------


def generate(target: Any, drafter: Any, tok: Any, grammar: Grammar, **kw: Any) -> Any:
    options = {"max_new_tokens": 60, "k": 3, "eos_token_id": [0], "seed": 0, **kw}
    return sd.generate(target, drafter, [1, 2, 3], grammar=grammar, tokenizer=tok, **options)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_output_that_ends_by_the_grammar_validates(
    models: tuple[Any, Any], tok: Any, temperature: float
) -> None:
    target, draft = models
    grammar = Grammar.json_schema(SCHEMA)
    ended = 0
    for name, drafter in drafters(target, draft).items():
        for seed in range(3):
            out = generate(target, drafter, tok, grammar, temperature=temperature, seed=seed)
            assert out.grammar_accepting == (out.stop_reason == "eos"), name
            if out.stop_reason == "eos":
                ended += 1
                assert out.tokens[-1] == 0 and 0 not in out.tokens[:-1]
                jsonschema.validate(json.loads(text_of(tok, out.tokens)), SCHEMA)
    assert ended >= 6  # the schema bounds every value: most runs end within the budget


@pytest.mark.parametrize("transfer", ["auto", "gathered"])
def test_constrained_greedy_speculation_equals_constrained_target_only(
    models: tuple[Any, Any], tok: Any, transfer: str
) -> None:
    target, draft = models
    for grammar in (Grammar.json_schema(SCHEMA), Grammar.regex("(ab|a|b)+(xy)?c")):
        plain = generate(target, None, tok, grammar, temperature=0)
        assert plain.forced == 0
        for name, drafter in drafters(target, draft).items():
            out = generate(target, drafter, tok, grammar, temperature=0, transfer=transfer)
            assert out.tokens == plain.tokens, name


def test_heads_keep_the_greedy_identity(tmp_path: Any, tok: Any) -> None:
    from heads_fixtures import tiny_head

    target = tiny_llama(vocab_size=V, hidden_size=32, num_layers=2, seed=5)
    grammar = Grammar.json_schema(SCHEMA)
    plain = generate(target, None, tok, grammar, temperature=0)
    for kind in ("eagle", "medusa"):
        head = tiny_head(target, tmp_path, kind, draft_vocab=V, depth=2, medusa_heads=2)
        drafter = sd.drafters.from_spec(f"{kind}:{head}", target)
        assert generate(target, drafter, tok, grammar, temperature=0).tokens == plain.tokens, kind


class Recording(sd.FixedK):
    """A fixed γ that keeps every round it is shown."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.observed: list[Any] = []

    def observe_round(self, r: Any) -> None:
        self.observed.append(r)


def test_forced_tokens_are_free_drafts_and_a_policy_does_not_learn_from_them(
    models: tuple[Any, Any], tok: Any
) -> None:
    target, _ = models
    seen: list[Any] = []
    policy = Recording(3)
    grammar = Grammar.json_schema(SCHEMA)
    out = generate(target, sd.PromptLookup(), tok, grammar, k=policy, on_round=seen.append)
    forced = [r for r in seen if r.forced]
    assert forced and all(r.asked == r.drafted == r.forced_drafts for r in forced)
    assert all(r.source == "grammar" for r in forced)
    assert out.forced == sum(r.forced_drafts for r in seen) > 0
    assert out.forced_accepted == sum(r.forced_accepted for r in seen)
    assert out.forced_accepted == out.forced  # at T = 0 each has one tokenization
    assert policy.observed == [r.drafters_part() for r in seen if not r.forced]
    assert out.rounds < out.new_tokens  # forced runs go through several tokens a forward


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_what_the_grammar_forces_after_the_drafts_extends_the_chain(
    models: tuple[Any, Any], tok: Any, temperature: float
) -> None:
    """Prompt lookup drafts "a" (the prompt's "b" was followed by "a"); the
    grammar [ab],,,: then forces ",,,:": one round runs the draft and its
    forced tail (q one-hot), the policy learns from the draft alone, and the
    text follows the grammar."""

    target, _ = models
    seen: list[Any] = []
    policy = Recording(1)
    out = sd.generate(
        target,
        sd.PromptLookup(min_ngram=1),
        [ID["b"], ID["a"], ID["b"]],
        max_new_tokens=12,
        k=policy,
        temperature=temperature,
        seed=4,
        eos_token_id=[0],
        grammar=Grammar.regex("[ab],,,:"),
        tokenizer=tok,
        on_round=seen.append,
    )
    first = seen[0]
    assert (first.asked, first.drafted, first.forced_drafts) == (5, 5, 4)
    assert first.tokens.tolist() == [ID["a"], *[ID[","]] * 3, ID[":"]]
    assert torch.equal(first.q[1:], torch.nn.functional.one_hot(first.tokens[1:], V).float())
    assert policy.observed[0].asked == policy.observed[0].drafted == 1
    assert policy.observed[0].accepted == min(first.accepted, 1)
    assert re.fullmatch("[ab],,,:", text_of(tok, out.tokens)) and out.tokens[-1] == 0
    assert out.forced == sum(r.forced_drafts for r in seen) >= 4


@pytest.mark.parametrize("make", ["draft-model", "early-exit"])
def test_a_model_drafter_draws_from_rows_masked_like_the_targets(
    models: tuple[Any, Any], tok: Any, make: str
) -> None:
    """Each draft row q_i of a model drafter gives no mass to a token the
    grammar refuses after the text and drafts 0..i-1 (so no draft is spent
    on a certain rejection), replayed here with a matcher of our own."""
    target, draft = models
    grammar = Grammar.regex("[abc0-9]{3,6}(xy|z)[abc]{2,5}")
    checked = 0
    for seed in range(4):
        seen: list[Any] = []
        out = generate(
            target,
            drafters(target, draft)[make],
            tok,
            grammar,
            temperature=1.0,
            seed=seed,
            on_round=seen.append,
        )
        assert out.grammar_accepting
        replay = bind(grammar, tok, V, [0])
        for r in seen:
            consumed = 0
            for i in range(0 if r.forced else r.drafted - r.forced_drafts):
                allowed = torch.from_numpy(replay.mask())
                assert float(r.q[i][~allowed].sum()) == 0.0, (seed, r.index, i)
                checked += 1
                if int(r.tokens[i]) == 0:
                    break
                assert replay.matcher.consume_token(int(r.tokens[i]))
                consumed += 1
            replay.matcher.rollback(consumed)
            for x in r.emitted:
                if x == 0:  # the text ends there (a round's tokens run past its EOS)
                    break
                assert replay.matcher.consume_token(x)
    assert checked > 20


def test_a_refused_deterministic_draft_is_not_run(models: tuple[Any, Any], tok: Any) -> None:
    """Prompt lookup proposes the prompt's continuation "zz", which the grammar refuses:
    the chain is cut there, so the forward runs the last token alone."""
    target, _ = models
    seen: list[Any] = []
    prompt = [ID["a"], ID["z"], ID["z"], ID["a"]]
    sd.generate(
        target,
        sd.PromptLookup(min_ngram=1),
        prompt,
        max_new_tokens=1,
        k=2,
        eos_token_id=[0],
        grammar=Grammar.regex("[ab]+"),
        tokenizer=tok,
        on_round=seen.append,
    )
    assert seen[0].drafted == 0 and seen[0].positions == 1


def test_a_budget_that_ends_first_says_the_output_is_incomplete(
    models: tuple[Any, Any], tok: Any
) -> None:
    target, _ = models
    out = generate(target, sd.PromptLookup(), tok, Grammar.json_schema(SCHEMA), max_new_tokens=4)
    assert out.stop_reason == "length" and out.grammar_accepting is False
    assert text_of(tok, out.tokens).startswith('{"a":')
    short = generate(target, None, tok, Grammar.choice(["ab1", "xyz"]), max_new_tokens=9)
    assert short.tokens[-1] == 0 and short.grammar_accepting
    plain = sd.generate(target, None, [1], max_new_tokens=2, eos_token_id=[])
    assert plain.grammar_accepting is None


def test_misuse_is_a_value_error(models: tuple[Any, Any], tok: Any) -> None:
    target, _ = models
    grammar = Grammar.regex("[ab]+")
    cases = [
        ({"grammar": grammar}, "tokenizer="),
        ({"tokenizer": tok}, "only with a grammar"),
        ({"grammar": grammar, "tokenizer": tok, "eos_token_id": []}, "EOS id"),
        ({"grammar": grammar, "tokenizer": tok, "tree": 4}, "chains only"),
        ({"grammar": "[ab]+", "tokenizer": tok}, "structured.Grammar"),
        ({"grammar": grammar, "tokenizer": object()}, "fast tokenizer"),
    ]
    for kw, message in cases:
        options = {"eos_token_id": [0], **kw}
        with pytest.raises(ValueError, match=re.escape(message)):
            sd.generate(target, sd.PromptLookup(), [1, 2], max_new_tokens=4, **options)


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup"])
def test_a_grammar_the_tokenizer_cannot_follow_is_a_dead_end_error(
    models: tuple[Any, Any], tok: Any, drafter: str
) -> None:
    """'q' has no token in the tiny vocabulary: the text "abq" cannot be
    tokenized, so the generation ends with GrammarDeadEnd (a ValueError;
    the server's 400), never a wrong token or an internal error."""
    target, draft = models
    with pytest.raises(GrammarDeadEnd, match="no tokenization"):
        generate(target, drafters(target, draft)[drafter], tok, Grammar.regex("abq"))


def test_each_batch_row_has_its_own_grammar_and_runs_as_it_would_alone(
    models: tuple[Any, Any], tok: Any
) -> None:
    target, _ = models
    grammars = [Grammar.json_schema(SCHEMA), None, Grammar.regex("(ab|a|b)+(xy)?c")]
    prompts = [[1, 2, 3], [4, 5], [ID["a"], ID["b"], ID["a"]]]
    requests = [
        sd.Request(prompt, 30, temperature=0.8, seed=i, eos_token_id=[0], grammar=g)
        for i, (prompt, g) in enumerate(zip(prompts, grammars, strict=True))
    ]
    out = sd.generate_batch(
        target, sd.PromptLookup, [], max_new_tokens=1, k=3, requests=requests, tokenizer=tok
    )
    for i, (prompt, g) in enumerate(zip(prompts, grammars, strict=True)):
        alone = sd.generate(
            target,
            sd.PromptLookup(),
            prompt,
            max_new_tokens=30,
            k=3,
            temperature=0.8,
            seed=i,
            eos_token_id=[0],
            grammar=g,
            tokenizer=tok if g is not None else None,
        )
        row = out.rows[i].result
        assert row is not None and row.tokens == alone.tokens, i
        assert row.forced == alone.forced and (row.forced > 0) == (g is not None)
    with pytest.raises(ValueError, match="tokenizer="):
        sd.generate_batch(target, sd.PromptLookup, [], max_new_tokens=1, requests=requests)


def test_a_batch_round_with_forced_drafts_does_not_measure_the_goodput_choice(
    models: tuple[Any, Any], tok: Any
) -> None:
    """The goodput policy compares a round's tokens with its choice's
    prediction only where every row ran the drafts it chose: a grammar's
    forced drafts were not its choice, so a round that carried some is
    observed without the choice (its costs still count)."""
    from specdec_rs.policy.goodput import ForwardProfile, Goodput

    target, _ = models
    profile = ForwardProfile({(b, n): 1.0 + 0.1 * n for b in (1, 2, 4) for n in range(1, 6)})
    policy = Goodput(k_max=3, profile=profile, probe=2)
    seen: list[tuple[bool, bool]] = []  # (a row had forced drafts, the choice was measured)
    observe = policy.observe

    def recorded(rounds: Any, rows: int, target_s: float, **kw: Any) -> None:
        rounds = list(rounds)
        seen.append((any(r.forced_drafts for _, r in rounds), kw.get("choice") is not None))
        observe(rounds, rows, target_s, **kw)

    policy.observe = recorded  # type: ignore[method-assign]
    json_row = sd.Request(
        [1, 2, 3], 30, temperature=0, eos_token_id=[0], grammar=Grammar.json_schema(SCHEMA)
    )
    requests = [json_row, sd.Request([4, 5, 4, 5], 30, temperature=0, eos_token_id=[0])]
    sd.generate_batch(
        target, sd.PromptLookup, [], max_new_tokens=1, requests=requests, tokenizer=tok,
        goodput=policy,
    )  # fmt: skip
    assert any(forced for forced, _ in seen) and any(measured for _, measured in seen)
    assert not any(forced and measured for forced, measured in seen)


def test_masked_logits_refuse_exactly_the_disallowed_ids() -> None:
    """The constrained target's logits (a Rust select on the CPU): refused ids
    at -inf in the masked rows whatever they held (NaN where the head skipped
    a panel), allowed ids and the later rows bit for bit, the padded ids
    dropped; the same as the torch select; bad shapes a ValueError."""
    from specdec_rs import _core
    from specdec_rs.structured import masked_logits

    rng = np.random.default_rng(0)
    width, vocab = 70, 67
    logits = torch.from_numpy(rng.standard_normal((4, width)).astype(np.float32))
    logits[0, 5] = logits[2, 60] = float("nan")
    allowed = rng.random((3, vocab)) < 0.4
    allowed[0, 5] = False
    got = masked_logits(logits, allowed, vocab)
    assert got.shape == (4, vocab)
    want = logits[:, :vocab].clone()
    want[:3][torch.from_numpy(~allowed)] = float("-inf")
    assert torch.equal(got[:3].isneginf(), torch.from_numpy(~allowed))
    np.testing.assert_array_equal(got.numpy().view(np.int32), want.numpy().view(np.int32))
    with pytest.raises(ValueError, match="allowed of"):
        _core.masked_logits(logits.numpy(), allowed[:, :10], vocab)
    with pytest.raises(ValueError, match="vocab"):
        _core.masked_logits(logits.numpy(), allowed, width + 1)

"""The suffix drafter: its index, its drafts, what its fresh copies share,
and greedy identity with target-only generation. (Its output law at T > 0:
`tests/test_law.py`.) p = target, q = draft, k = γ."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import specdec_rs as sd
from greedy_fixtures import greedy_runs
from specdec_rs.drafters.suffix import SharedSuffixes, SuffixIndex, chain_from, tree_from
from specdec_rs.models import tiny_llama


def test_the_index_counts_substrings_and_forgets_them_again() -> None:
    index = SuffixIndex(depth=3)
    index.add([1, 2, 1, 2, 3])
    assert index.find([1, 2]).count == 2  # type: ignore[union-attr]
    assert index.find([2, 1, 2]).count == 1  # type: ignore[union-attr]
    assert index.find([1, 2, 1, 2]) is None  # deeper than depth
    node = index.find([1, 2])
    assert node is not None and {t: c.count for t, c in node.children.items()} == {1: 1, 3: 1}
    index.add([4, 1, 2, 3])
    index.remove([1, 2, 1, 2, 3])
    assert index.find([1, 2]).count == 1 and index.find([2, 1]) is None  # type: ignore[union-attr]
    index.remove([4, 1, 2, 3])
    assert index.root.children == {}


def test_growing_one_token_at_a_time_equals_adding_at_once() -> None:
    seq = [5, 1, 2, 5, 1, 3, 5, 1, 2, 2]
    whole, grown = SuffixIndex(depth=4), SuffixIndex(depth=4)
    whole.add(seq)
    suffixes: list = []
    for t in seq:
        suffixes = grown.grow(suffixes, [t])

    def dump(node: object, path: tuple[int, ...] = ()) -> dict[tuple[int, ...], int]:
        out = {}
        for t, c in node.children.items():  # type: ignore[attr-defined]
            out[(*path, t)] = c.count
            out |= dump(c, (*path, t))
        return out

    assert dump(whole.root) == dump(grown.root)
    node = grown.find([2])
    assert len(suffixes) == 4 and node is not None and suffixes[0] == node.id


def test_the_longest_match_with_a_continuation() -> None:
    index = SuffixIndex(depth=8)
    index.add([7, 1, 2, 3, 9, 4, 1, 2])
    # "4 1 2" occurred, but only at the end (no continuation): the match is "1 2" (then 3)
    node, m = index.longest_match([0, 4, 1, 2], 8)
    assert m == 2 and node == index.find([1, 2]) and node is not None and 3 in node.children
    node, m = index.longest_match([5, 1, 2], 8)
    assert m == 2 and node is not None and 3 in node.children
    assert index.longest_match([6, 6], 8) == (None, 0)


def test_drafts_follow_frequent_continuations_above_the_threshold() -> None:
    index = SuffixIndex(depth=6)
    for _ in range(3):
        index.add([1, 2, 3, 4])
    index.add([1, 2, 5, 6])
    node = index.find([1, 2])
    assert node is not None
    chain = chain_from(node, 4, 0.3)
    assert chain.tokens == [3, 4] and chain.probs == pytest.approx([0.75, 0.75])
    assert chain_from(node, 4, 0.8).tokens == []  # 3 follows only 3 of 4 times
    assert chain_from(node, 1, 0.1).tokens == [3]  # the limit
    tokens, parents = tree_from(node, 4, 4, 0.1)
    assert tokens == [3, 4, 5, 6] and parents == [-1, 0, -1, 2]


def test_a_drafter_copies_share_one_global_index_and_it_stays_bounded() -> None:
    target = tiny_llama(num_layers=2)
    first = sd.SuffixDrafter(global_tokens=30)
    a = sd.generate(target, first, [5, 6, 7], max_new_tokens=12, temperature=0, eos_token_id=[])
    second = first.fresh()
    assert second.shared is first.shared
    out = sd.generate(target, second, [9, 8], max_new_tokens=12, temperature=0, eos_token_id=[])
    assert (
        out.tokens
        == sd.generate(
            target, None, [9, 8], max_new_tokens=12, temperature=0, eos_token_id=[]
        ).tokens
    )
    shared = first.shared
    assert shared is not None and shared.tokens <= 30 or len(shared.sequences) == 1
    assert len(a.tokens) == 12


def test_eviction_drops_the_oldest_sequences() -> None:
    shared = SharedSuffixes(depth=4, max_tokens=6)
    one, two = shared.open(), shared.open()
    shared.extend(one, [], [1, 2, 3, 4])
    shared.extend(two, [], [5, 6, 7])
    assert shared.tokens == 3 and list(shared.sequences) == [two]
    assert shared.index.find([1, 2]) is None and shared.index.find([5, 6]) is not None
    assert shared.extend(one, [], [9]) == []  # an evicted sequence no longer counts
    assert shared.index.find([9]) is None


@pytest.mark.parametrize("tree", [None, 6])
def test_greedy_output_is_the_targets_own(tree: int | None) -> None:
    """Prompts that repeat, so the drafter drafts; the same drafter object
    over all prompts, so the global index serves the later ones."""
    target = tiny_llama(num_layers=2, vocab_size=16)
    drafter = sd.SuffixDrafter()
    prompts = ([1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4], [1, 2, 3, 1])
    runs = greedy_runs(target, lambda: drafter, prompts, max_new_tokens=20, k=4, tree=tree)
    assert sum(out.drafted for out in runs) > 0


def test_it_drafts_in_a_batch_and_learns_across_its_rows() -> None:
    target = tiny_llama(num_layers=2, vocab_size=16)
    prompts = [[1, 2, 3, 1, 2], [3, 1, 2, 3], [7, 7, 7]]
    shared = sd.SuffixDrafter()
    out = sd.generate_batch(
        target,
        sd.drafters.copies(shared),
        prompts,
        max_new_tokens=10,
        temperature=0,
        eos_token_id=[],
        k=3,
    )
    for prompt, row in zip(prompts, out.rows, strict=True):
        plain = sd.generate(target, None, prompt, max_new_tokens=10, temperature=0, eos_token_id=[])
        assert row.result is not None and row.result.tokens == plain.tokens
    assert shared.shared is not None and len(shared.shared.sequences) == 3


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"depth": 1}, "depth"),
        ({"factor": 0}, "factor"),
        ({"offset": -1}, "offset"),
        ({"min_prob": 0}, "min_prob"),
        ({"min_prob": 1.5}, "min_prob"),
        ({"global_tokens": -1}, "global_tokens"),
        ({"min_match": 0}, "min_match"),
        ({"min_match": 32}, "min_match"),
    ],
)
def test_bad_options_are_value_errors(options: dict[str, float], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        sd.SuffixDrafter(**options)  # type: ignore[arg-type]


def test_the_cli_name_builds_it() -> None:
    target = tiny_llama(num_layers=2)
    assert isinstance(sd.drafters.from_spec("suffix", target), sd.SuffixDrafter)


def test_the_repeated_workload_asks_twice_and_quotes_the_answer() -> None:
    from specdec_rs.measure import repeated

    seen: list[list[dict[str, str]]] = []

    def fake(messages: list[dict[str, str]]) -> tuple[str, object]:
        seen.append(messages)
        return "First sentence here. Then more.", object()

    asked = repeated.run_repeated(fake, code=2, chat=2)  # type: ignore[arg-type]
    assert [(a.kind, a.repeat) for a in asked] == [
        ("code", False), ("code", True), ("code", False), ("code", True),
        ("chat", False), ("chat", True), ("chat", False), ("chat", True),
    ]  # fmt: skip
    assert seen[1][0]["content"] == repeated.edited(seen[0][0]["content"]) != seen[0][0]["content"]
    follow = seen[5]
    assert [m["role"] for m in follow] == ["user", "assistant", "user"]
    assert '"First sentence here."' in follow[2]["content"]
    from specdec_rs.prompts.training import check_held_out

    check_held_out([m[0]["content"] for m in seen])  # not the evaluation prompts


def test_the_global_index_saves_and_loads_back(tmp_path: Path) -> None:
    target = tiny_llama(num_layers=2, vocab_size=16)
    drafter = sd.SuffixDrafter(global_tokens=500)
    for prompt in ([1, 2, 3, 1, 2], [4, 5, 6]):
        sd.generate(target, drafter, prompt, max_new_tokens=8, temperature=0, eos_token_id=[])
    path = tmp_path / "suffix.json"
    drafter.save(path)
    loaded = sd.drafters.from_spec(f"suffix:{path}", target)
    assert loaded.shared is not None and drafter.shared is not None
    assert list(loaded.shared.sequences) == list(drafter.shared.sequences)
    assert loaded.shared.max_tokens == 500 and loaded.depth == drafter.depth
    seq = drafter.shared.sequences[0]
    assert loaded.shared.index.find(seq[:3]).count == drafter.shared.index.find(seq[:3]).count  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="outside the target's vocabulary of 8"):
        sd.drafters.from_spec(f"suffix:{path}", tiny_llama(num_layers=2, vocab_size=8))


def _damaged(path: Path, change: Any) -> Path:
    data = json.loads(path.read_text())
    change(data)
    out = path.with_name("damaged.json")
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d: d["index"]["sequences"][0].append(3), "checksum"),
        (lambda d: d.update(version=2), "version 2"),
        (lambda d: d.update(format="other"), "not a specdec-suffix-index file"),
        (lambda d: d.pop("sha256"), "checksum"),
    ],
)
def test_a_damaged_saved_index_is_a_value_error(tmp_path: Path, change: Any, says: str) -> None:
    drafter = sd.SuffixDrafter()
    sd.generate(tiny_llama(num_layers=2), drafter, [1, 2, 1], max_new_tokens=4, temperature=0)
    path = tmp_path / "suffix.json"
    drafter.save(path)
    with pytest.raises(ValueError, match=says):
        sd.SuffixDrafter.load(_damaged(path, change))
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        sd.SuffixDrafter.load(tmp_path / "junk.json")
    with pytest.raises(ValueError, match="missing"):
        sd.drafters.from_spec(f"suffix:{tmp_path / 'nothing.json'}", tiny_llama(num_layers=2))
    with pytest.raises(ValueError, match="no global index"):
        sd.SuffixDrafter(global_tokens=0).save(path)


def test_bad_token_ids_and_stale_nodes_are_value_errors() -> None:
    index = SuffixIndex(depth=3)
    with pytest.raises(ValueError, match="token id"):
        index.add([1, -2])
    with pytest.raises(ValueError, match="token id"):
        index.add([1, 2**33])
    index.add([1, 2])
    node = index.find([1, 2])
    assert node is not None and node.count == 1 and len(index) == 4  # root, 1, 2, 1 2
    index.remove([1, 2])
    with pytest.raises(ValueError, match="stale"):
        _ = node.count
    assert index.find([1, 2]) is None and index.find([-1]) is None and len(index) == 1


def _forged(path: Path, change: Any) -> Path:
    """A saved index edited and its checksum recomputed (a checksum is no signature)."""
    from specdec_rs.drafters.suffix import digest

    data = json.loads(path.read_text())
    change(data["index"])
    data["sha256"] = digest(data["index"])
    out = path.with_name("forged.json")
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda i: i["sequences"][0].append(2**63), "sequence 0 holds 9223372036854775808"),
        (lambda i: i["sequences"][0].append(2**40), "not a token id"),
        (lambda i: i["sequences"][0].append(True), "sequence 0 holds True"),
        (lambda i: i.update(depth=2), "does not fit"),
        (lambda i: i.update(depth=True), "malformed"),
    ],
)
def test_a_forged_saved_index_is_refused_naming_the_file(
    tmp_path: Path, change: Any, says: str
) -> None:
    drafter = sd.SuffixDrafter()
    sd.generate(tiny_llama(num_layers=2), drafter, [1, 2, 1], max_new_tokens=4, temperature=0)
    path = tmp_path / "suffix.json"
    drafter.save(path)
    forged = _forged(path, change)
    for attempt in (
        lambda: sd.SuffixDrafter.load(forged),
        lambda: sd.drafters.parse_spec(f"suffix:{forged}"),  # before any model loads
    ):
        with pytest.raises(ValueError) as e:
            attempt()
        assert str(forged) in str(e.value) and says in str(e.value), e.value


def test_save_checks_its_path(tmp_path: Path) -> None:
    drafter = sd.SuffixDrafter()
    sd.generate(tiny_llama(num_layers=2), drafter, [1, 2, 1], max_new_tokens=4, temperature=0)
    with pytest.raises(ValueError, match="is a folder"):
        drafter.save(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        drafter.save(tmp_path / "no" / "such" / "index.json")
    with pytest.raises(ValueError, match="pass a file name"):
        drafter.save("")
    drafter.save(tmp_path / "ok.json")
    assert sd.SuffixDrafter.load(tmp_path / "ok.json").shared is not None


def test_the_global_index_is_bounded_in_nodes() -> None:
    """Text that never repeats adds up to `depth` nodes a token: the node
    bound evicts the oldest sequences, the growing one too when it alone
    passes it (it then stops counting)."""
    shared = SharedSuffixes(depth=8, max_tokens=10**6, max_nodes=500)
    first = shared.open()
    suffixes: list[int] = []
    for t in range(200):  # 200 distinct tokens: ~8 nodes each
        suffixes = shared.extend(first, suffixes, [t])
        assert len(shared.index) <= 500 + 8
    assert id(first) not in shared.live and len(shared.index) <= 500
    second = shared.open()
    shared.extend(second, [], [1000, 1001, 1002])
    assert list(shared.sequences) == [[1000, 1001, 1002]] and len(shared.index) == 1 + 6
    with pytest.raises(ValueError, match="global_nodes"):
        sd.SuffixDrafter(global_nodes=0)

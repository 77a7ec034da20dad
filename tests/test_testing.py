"""specdec_rs.testing: the exactness harness others import, and `specdec
audit`. p = target, q = draft.

The quick tests (default suite) check the harness's plumbing on small runs.
The `audit` tests (`pytest -m audit`, a CI step of their own) run the full
suite: every verifier of the project and transformers' own pass, and every
known bug fails (the power stated in the module's docstring).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from specdec_rs import testing
from specdec_rs.reference import TREE_BUGS, verify_batch_numpy, verify_tree_numpy

CHAIN_BUGS = [
    "resample_from_p",
    "continue_after_reject",
    "inverted_ratio",
    "greedy_check",
    "off_by_one",
    "no_verification",
]


def numpy_chain(variant: str) -> testing.ChainVerifier:
    def verify(p: np.ndarray, q: np.ndarray, d: np.ndarray, rng: np.random.Generator) -> Any:
        tokens, num = verify_batch_numpy(p[None], q[None], d[None], rng, variant=variant)
        return tokens[0, : num[0]]

    verify.__name__ = f"numpy {variant}"
    return verify


def numpy_tree(children: str, variant: str) -> testing.TreeVerifier:
    def verify(
        p: np.ndarray, q: np.ndarray, t: np.ndarray, par: np.ndarray, rng: np.random.Generator
    ) -> Any:
        return verify_tree_numpy(p, q, t, par, rng, children=children, variant=variant)

    return verify


# --------------------------------------------------------------- quick tests


def test_assert_exact_passes_an_exact_verifier() -> None:
    own = testing.project_verifiers()
    audit = testing.assert_exact(own["chain"], runs=2_000, cases=testing.default_cases()[:2])
    assert audit.passed and len(audit.results) == 2
    assert audit.false_alarm == pytest.approx(4e-6)


def test_assert_exact_raises_with_the_report_for_a_bug() -> None:
    with pytest.raises(AssertionError, match="dense .*FAIL"):
        testing.assert_exact(numpy_chain("resample_from_p"), runs=3_000)


def test_a_broken_contract_fails_with_its_reason() -> None:
    def emits_too_many(p: np.ndarray, q: np.ndarray, d: np.ndarray, rng: Any) -> Any:
        return np.array([*d, 0, 0])

    audit = testing.audit_chain(emits_too_many, runs=200, cases=testing.default_cases()[:1])
    assert not audit.passed
    assert "expected the accepted drafts" in audit.results[0].note


def test_tree_audit_skips_the_cases_it_cannot_draw() -> None:
    own = testing.project_verifiers()
    audit = testing.audit_tree(
        own["tree-without_replacement"],  # type: ignore[arg-type]
        children="without_replacement",
        runs=300,
        cases=testing.default_cases()[:3],
        significance=1e-6,
    )
    assert audit.skipped == ["one-hot q"]
    assert [r.case for r in audit.results] == ["dense", "sparse target"]


def test_case_exact_law_sums_to_one_and_buckets_large_vocabularies() -> None:
    for case in testing.default_cases():
        law = case.exact()
        assert law.shape == (case.cells(), case.cells())
        assert law.sum() == pytest.approx(1.0)
    assert testing.default_cases()[-1].cells() == 8


def test_cli_audit_json(capsys: pytest.CaptureFixture[str]) -> None:
    from specdec_rs.cli import main

    assert main(["audit", "chain", "block", "--runs", "300", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [a["verifier"] for a in out["audits"]] == [
        "specdec_rs.verify",
        'specdec_rs.verify (method="block")',
    ]
    assert all(r["passed"] for a in out["audits"] for r in a["results"])
    with pytest.raises(SystemExit) as exit_:
        main(["audit", "nothing"])
    assert exit_.value.code == 2


def test_cli_audit_defaults_to_every_verifier(capsys: pytest.CaptureFixture[str]) -> None:
    """No names: the documented default "all" (argparse once refused it)."""
    from specdec_rs.cli import main

    assert main(["audit", "--runs", "100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is True and all(a["passed"] is True for a in out["audits"])
    names = [a["verifier"] for a in out["audits"]]
    assert len(names) == 6 and names[0] == "specdec_rs.verify" and "transformers" in names[-1]


def shifted_ids(shift: Any, dtype: Any = np.int64) -> testing.ChainVerifier:
    """The exact verifier, its last emitted id moved by `shift` (as `dtype`)."""
    own = testing.project_verifiers()["chain"]

    def verify(p: np.ndarray, q: np.ndarray, d: np.ndarray, rng: np.random.Generator) -> Any:
        out = np.asarray(own(p, q, d, rng)).astype(dtype)
        out[-1] += shift
        return out

    return verify


@pytest.mark.parametrize(
    ("shift", "dtype", "bad"),
    [(-5, np.int64, "-"), (5, np.int64, ""), (2**63, np.uint64, "")],
    ids=["negative", "past V", "uint64"],
)
def test_token_ids_out_of_range_fail_with_the_reason(shift: int, dtype: Any, bad: str) -> None:
    """-V wraps around the histogram (and t % S lands on the same state), so
    without the range check the negative ids were statistically invisible."""
    case = testing.default_cases()[:1]
    audit = testing.audit_chain(shifted_ids(shift, dtype), runs=200, cases=case)
    assert not audit.passed
    assert "out of [0, 5)" in audit.results[0].note and f"id {bad}" in audit.results[0].note
    with pytest.raises(AssertionError, match=r"out of \[0, 5\)"):
        testing.assert_exact(shifted_ids(shift, dtype), runs=200, cases=case)


def test_a_tree_verifier_returning_tokens_and_nodes_is_told_so() -> None:
    import specdec_rs as sd

    def pair(p: Any, q: Any, t: Any, par: Any, rng: np.random.Generator) -> Any:
        return sd.verify_tree(p, q, t, par, int(rng.integers(2**63)), children="iid")

    audit = testing.audit_tree(pair, runs=100, cases=testing.default_cases()[:1])
    assert not audit.passed and "not (tokens, nodes)" in audit.results[0].note


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cases": []}, "audits nothing"),
        ({"cases": [1]}, "must be a testing.Case"),
        ({"cases": testing.default_cases()[0]}, "must be a list"),
        ({"significance": 0}, "significance"),
        ({"significance": float("nan")}, "significance"),
        ({"significance": 1}, "significance"),
        ({"significance": -1e-3}, "significance"),
        ({"significance": "0.01"}, "significance"),
        ({"runs": 2**64}, "runs"),
        ({"runs": 10}, "runs"),
    ],
)
def test_the_harness_refuses_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    own = testing.project_verifiers()["chain"]
    with pytest.raises(ValueError, match=message):
        testing.audit_chain(own, **kwargs)
    with pytest.raises(ValueError, match=message):
        testing.assert_exact(own, **kwargs)


def test_bad_cases_are_refused() -> None:
    p = np.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match="probability rows"):
        testing.Case("bad", p, p * 2)
    with pytest.raises(ValueError, match="one shape"):
        testing.Case("bad", p, np.full((2, 4), 0.25))
    with pytest.raises(ValueError, match="start"):
        testing.Case("bad", p, p, start=3)


def test_cli_audit_refuses_unbounded_runs() -> None:
    from specdec_rs.cli import main

    assert main(["audit", "chain", "--runs", str(2**64)]) == 2


# ---------------------------------------------------------- full-size audits


@pytest.mark.audit
@pytest.mark.parametrize("name", ["chain", "block", "tree"])
def test_the_project_verifiers_pass(name: str) -> None:
    report = testing.run_audits([name])
    print("\n".join(a.report() for a in report.audits))
    assert report.passed


@pytest.mark.audit
@pytest.mark.parametrize("children", ["iid", "without_replacement", "fixed"])
def test_the_numpy_tree_reference_passes(children: str) -> None:
    audit = testing.audit_tree(numpy_tree(children, "exact"), children=children)
    assert audit.passed, audit.report()


@pytest.mark.audit
@pytest.mark.parametrize("variant", CHAIN_BUGS)
def test_every_chain_bug_fails(variant: str) -> None:
    audit = testing.audit_chain(numpy_chain(variant), fail_fast=True)
    print(audit.report())
    assert not audit.passed and not audit.results[0].passed  # caught on the first case


TREE_CASES = [(kind, v) for v in TREE_BUGS if v != "as_iid" for kind in ("iid",)] + [
    ("fixed", "as_iid"),
    ("without_replacement", "as_iid"),
    ("without_replacement", "no_update"),
]


@pytest.mark.audit
@pytest.mark.parametrize(("children", "variant"), TREE_CASES)
def test_every_tree_bug_fails(children: str, variant: str) -> None:
    audit = testing.audit_tree(numpy_tree(children, variant), children=children, fail_fast=True)
    print(audit.report())
    assert not audit.passed and not audit.results[0].passed


@pytest.mark.audit
def test_transformers_speculative_sampling_passes() -> None:
    pytest.importorskip("transformers")
    report = testing.run_audits(["transformers"], runs=5_000)
    print(report.audits[0].report())
    assert report.passed

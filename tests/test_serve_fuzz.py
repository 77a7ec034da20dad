"""The structured-output fuzz through `specdec serve` (tests/schema_fuzz.py):
drawn JSON schemas and malformed response_format / structured_outputs
bodies; each a 200 (validating when it stops by the grammar) or a 400, no
500, crash or hang, and the server goes on. The default suite sends 150
schemas and 80 bodies drawn once and stored (tests/data/schema_fuzz_corpus.json);
`pytest -m fuzz` draws 2,000 schemas and 500 bodies afresh."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_fixtures import model_folder, serve
from specdec_rs.serve.server import Background

pytest.importorskip("llguidance")
pytest.importorskip("hypothesis_jsonschema")
from schema_fuzz import Ask, corpus, draw, fuzz  # noqa: E402 (needs hypothesis_jsonschema)

__all__ = ["model_folder"]  # a fixture: imported to be found, not called


@pytest.fixture(scope="module")
def server(model_folder: Path) -> Iterator[Background]:
    bg = serve(model_folder, max_batch=4, drafters=("none", "suffix"))
    yield bg
    bg.stop()


def check(server: Background, asks: list[Ask]) -> None:
    tally = fuzz(server.url, asks)
    n_bodies = sum(kind == "malformed" for kind, _ in asks)
    print(tally.summary())
    assert not tally.failures, "\n".join(tally.failures[:20])
    seen = tally.outcomes
    # the draws reach every kind of answer: schemas compiled and followed to
    # the end, schemas refused, malformed bodies refused
    assert seen["schema: 200 stop"] > 0 and seen["schema: 400"] > 0, seen
    assert seen["malformed: 400"] > n_bodies // 2, seen


def test_drawn_schemas_and_malformed_bodies_get_a_valid_answer_or_a_400(
    server: Background,
) -> None:
    asks = corpus()
    assert len(asks) == 230
    check(server, asks)


@pytest.mark.fuzz
def test_the_full_fuzz(server: Background) -> None:
    check(server, draw(2000, 500))

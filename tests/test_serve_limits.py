"""The server under hostile input: no request stalls the others (long stop
strings, huge bodies and prompts), every bad request is a 4xx naming its
field, stop strings and token counts are right at character splits, and a
hypothesis-generated fuzz of bodies through the real app, with /health
answering within a second throughout. p = target, q = draft, k = γ."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serve_fixtures import CONTEXT, HTTP, client, model_folder, serve
from specdec_rs.cli import main
from specdec_rs.serve.server import Background
from specdec_rs.serve.text import MAX_STOP_CHARS, MAX_STOPS, StopScan, TextAssembler

__all__ = ["model_folder"]  # a fixture: imported to be found, not called


@pytest.fixture(scope="module")
def server(model_folder: Path) -> Iterator[Background]:
    bg = serve(model_folder, max_batch=8, max_queue=40, max_body_mb=4.0)
    yield bg
    bg.stop()


class HealthWatch:
    """Polls /health on its own thread; `worst` is the slowest answer (s)."""

    def __init__(self, bg: Background):
        self.url, self.worst, self.answers = bg.url + "/health", 0.0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self.stop.is_set():
                started = time.perf_counter()
                assert c.get(self.url).status_code == 200
                self.worst = max(self.worst, time.perf_counter() - started)
                self.answers += 1
                time.sleep(0.05)

    def __enter__(self) -> HealthWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(60)


# ---- availability
def test_long_stops_and_a_huge_prompt_never_stall_health(server: Background) -> None:
    """16 stop strings of the longest length streaming for seconds, and a
    12 MB prompt and a prompt past any context's characters, in flight
    together: /health answers within 1 s throughout."""
    stops = [("w" * (MAX_STOP_CHARS - 1)) + chr(0x4E00 + i) for i in range(MAX_STOPS)]
    results: dict[str, Any] = {}

    def long_stops() -> None:
        body = {"prompt": "a b a b", "max_tokens": 1500, "ignore_eos": True, "stop": stops}
        body["stream"] = True
        with HTTP.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
            results["stops"] = [x for x in r.iter_lines() if x][-1]

    def huge(key: str, size: int) -> None:
        body = json.dumps({"prompt": "x " * (size // 2), "max_tokens": 4}).encode()
        r = HTTP.post(server.url + "/v1/completions", content=body, timeout=120)
        results[key] = (r.status_code, r.json()["error"])

    threads = [
        threading.Thread(target=long_stops),
        threading.Thread(target=huge, args=("12MB", 12 << 20)),
        threading.Thread(target=huge, args=("3MB", 3 << 20)),
    ]
    with HealthWatch(server) as watch:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert watch.answers > 5 and watch.worst < 1.0, watch.worst
    assert results["stops"] == "data: [DONE]"
    status, error = results["12MB"]
    assert status == 413 and "at most 4,194,304 bytes" in error["message"]
    status, error = results["3MB"]  # under the body limit, past any context: not tokenized
    assert status == 400 and error["code"] == "context_length_exceeded"
    assert error["param"] == "prompt" and "characters" in error["message"]


def test_stop_strings_are_bounded_in_count_and_length(server: Background) -> None:
    for stop, says in (
        (["x" * (MAX_STOP_CHARS + 1)], f"at most {MAX_STOP_CHARS} characters"),
        (["ab"] * (MAX_STOPS + 1), f"at most {MAX_STOPS} items"),
        ("\ud800", "unicode string"),
    ):
        body = json.dumps({"prompt": "x", "stop": stop}).encode()  # \ud800 escaped
        r = HTTP.post(server.url + "/v1/completions", content=body)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"].startswith("stop")


# ---- refusals naming the field
@pytest.mark.parametrize(
    ("route", "body", "param", "says"),
    [
        ("completions", {"prompt": "ok \ud800"}, "prompt", "lone surrogate"),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "\udcff"}]},
            "messages.0.content",
            "lone surrogate",
        ),
        ("completions", {"prompt": "x", "stream_options": {}}, "stream_options", "with stream"),
        ("completions", {"prompt": [5] * CONTEXT, "max_tokens": 4}, "prompt", "context"),
    ],
)
def test_bad_fields_are_400s_naming_them(
    server: Background, route: str, body: dict[str, Any], param: str | None, says: str
) -> None:
    r = HTTP.post(server.url + f"/v1/{route}", content=json.dumps(body).encode())
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert says in error["message"] and error["param"] == param, error


def test_the_bearer_scheme_is_case_insensitive(model_folder: Path) -> None:
    bg = serve(model_folder, api_key="s3cret")
    try:
        for header in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret"):
            r = HTTP.get(bg.url + "/v1/models", headers={"authorization": header})
            assert r.status_code == 200, header
        for header in ("Basic s3cret", "s3cret", "Bearer s3cre", ""):
            r = HTTP.get(bg.url + "/v1/models", headers={"authorization": header})
            assert r.status_code == 401, header
    finally:
        bg.stop()


def test_a_client_that_leaves_mid_body_logs_nothing(
    server: Background, caplog: pytest.LogCaptureFixture
) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            s = socket.create_connection((host, int(port)))
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 1000\r\n\r\n" + b'{"prompt": "'
            )
            s.close()
        time.sleep(0.5)
        assert client(server).completions.create(model="tiny", prompt="x", max_tokens=2).usage
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


# ---- stop strings and counts at character splits (unit)
class Bytes:
    """A byte-level tokenizer: token i is byte i."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def test_a_stop_completed_by_an_id_held_back_counts_only_its_tokens() -> None:
    """ "ab" then é's first byte: nothing is text yet (it ends inside a
    character); é's second byte completes it, and the stop "ab" ended at
    the second id, not at the feed's first."""
    a = TextAssembler(Bytes(), ["ab"])
    e = list("é".encode())
    assert a.feed([ord("a"), ord("b"), e[0]]) == ""
    assert a.feed([e[1], ord("x")]) == "" and a.stopped
    assert a.tokens == 2


def test_finish_applies_the_stops_to_what_it_forces_out() -> None:
    a = TextAssembler(Bytes(), ["end"])
    assert a.feed([*b"the en"]) == "the "
    assert a.feed([*b"d", 0xE2]) == ""  # "d" and an unfinished character: held
    assert a.finish() == "" and a.stopped and a.text == "the " and a.tokens == 7
    b = TextAssembler(Bytes(), ["zz"])
    assert b.feed([*b"ok z", 0xE2]) == ""  # it ends inside a character: all held
    assert b.finish() == "ok z\ufffd" and not b.stopped


@settings(max_examples=300)
@given(
    text=st.text(alphabet="abc", max_size=40),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=6), max_size=4),
    cuts=st.lists(st.integers(1, 5), max_size=20),
)
def test_the_stop_automata_equal_a_plain_search(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    """Fed in pieces, the first stop and the hold-back are those of a scan
    of the whole text (the earliest start, the shorter stop on a tie)."""
    scan, at, found = StopScan(stops), 0, None
    pieces, i = [], 0
    for c in [*cuts, len(text)]:
        pieces.append(text[i : i + c])
        i += c
    for piece in pieces:
        if not piece:
            continue
        found = scan.feed(piece, at)
        at += len(piece)
        fed = text[:at]
        hits = [(fed.find(s), len(s), s) for s in set(stops) if s in fed]
        if found is not None or hits:
            assert found is not None and hits
            start, _, stop = min(hits)
            assert found == (start, stop)
            break
        hold = max((n for s in stops for n in range(1, len(s)) if fed.endswith(s[:n])), default=0)
        assert scan.hold == hold


# ---- command-line flags, checked before the model loads
@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: the flag must be refused before."""
    from specdec_rs.cli import serve as cli_serve

    def load(*_: Any) -> Any:
        raise AssertionError("the model was loaded before the flag was checked")

    monkeypatch.setattr(cli_serve, "load_target", load)


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["--api-key", ""], None, "--api-key (or $SPECDEC_API_KEY) is empty"),
        ([], "", "--api-key (or $SPECDEC_API_KEY) is empty"),
        (["--served-model-name", ""], None, "--served-model-name must be a non-empty name"),
        (["--drafter", "lookahead:²,2,1"], None, "expected lookahead:W,N,G"),
        (["--drafter", "lookahead:0,2,1"], None, "window (W)"),
        (["--drafters", "nope,lookahead:2,3,2"], None, "drafter 'nope' is not understood"),
        (["--max-body-mb", "0"], None, "--max-body-mb"),
        (["--prefill-chunk", "-1"], None, "--prefill-chunk"),
        (["--prefix-cache-mb", "-1"], None, "--prefix-cache-mb"),
    ],
)
def test_serve_flags_are_refused_before_the_model_loads(
    no_model: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: str | None,
    says: str,
) -> None:
    if env is not None:
        monkeypatch.setenv("SPECDEC_API_KEY", env)
    else:
        monkeypatch.delenv("SPECDEC_API_KEY", raising=False)
    assert main(["serve", "--port", "0", *argv]) == 2
    assert says in capsys.readouterr().err


def test_a_port_in_use_and_a_damaged_suffix_file_fail_before_the_model_loads(
    no_model: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
        assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
    damaged = tmp_path / "index.json"
    damaged.write_text("{not json")
    assert main(["serve", "--port", "0", "--drafter", f"suffix:{damaged}"]) == 2
    assert str(damaged) in capsys.readouterr().err


def test_drafters_are_split_only_before_a_kind() -> None:
    from specdec_rs.drafters import split_specs

    assert split_specs("lookahead:2,3,2") == ["lookahead:2,3,2"]
    assert split_specs("suffix, lookahead:2,3,2,prompt-lookup") == [
        "suffix",
        "lookahead:2,3,2",
        "prompt-lookup",
    ]
    assert split_specs("") == [] and split_specs("none,,none") == ["none", "none"]


def test_a_drafters_list_with_commas_serves(model_folder: Path) -> None:
    bg = serve(model_folder, drafters=("lookahead:2,3,2",))
    try:
        r = client(bg).completions.create(
            model="tiny", prompt="a b", max_tokens=4, temperature=0,
            extra_body={"speculation": {"drafter": "lookahead:2,3,2"}},
        )  # fmt: skip
        assert r.usage.speculation["drafter"] == "lookahead:2,3,2"  # type: ignore[attr-defined]
    finally:
        bg.stop()


# ---- the fuzz: hypothesis bodies through the real app
FIELDS = {
    "prompt": st.one_of(
        st.text(max_size=40),
        st.lists(st.integers(-5, 60_000), max_size=8),
        st.lists(st.text(max_size=5), max_size=2),
        st.none(),
        st.integers(),
    ),
    # (null: the rest of the context, thousands of tokens: left to the other tests)
    "max_tokens": st.one_of(st.integers(-2, 40), st.floats(), st.text(max_size=3)),
    "temperature": st.one_of(st.floats(-1, 3), st.integers(-1, 3), st.text(max_size=2)),
    "top_p": st.one_of(st.floats(-0.5, 1.5), st.none()),
    "top_k": st.one_of(st.integers(-3, 70_000), st.none()),
    "stop": st.one_of(
        st.text(max_size=8), st.lists(st.text(max_size=8), max_size=20), st.integers()
    ),
    "seed": st.one_of(st.integers(-3, 2**64), st.none()),
    "stream": st.booleans(),
    "stream_options": st.one_of(st.none(), st.just({"include_usage": True}), st.just([])),
    "speculation": st.one_of(
        st.none(),
        st.fixed_dictionaries(
            {}, optional={"k": st.integers(-1, 40), "drafter": st.sampled_from(["none", "x"])}
        ),
    ),
    "ignore_eos": st.booleans(),
    "logit_bias": st.one_of(st.just({}), st.just({"5": 1})),
    "colour": st.integers(),
}


def bodies() -> st.SearchStrategy[Any]:
    obj = st.fixed_dictionaries({}, optional=FIELDS)
    chat = st.fixed_dictionaries(
        {
            "messages": st.one_of(
                st.lists(
                    st.fixed_dictionaries(
                        {
                            "role": st.sampled_from(["user", "system", "assistant", "robot"]),
                            "content": st.one_of(st.text(max_size=30), st.integers()),
                        }
                    ),
                    max_size=3,
                ),
                st.text(max_size=3),
            ),
            "max_tokens": FIELDS["max_tokens"],
        },
        optional={k: FIELDS[k] for k in ("temperature", "stop", "stream", "seed")},
    )
    raw = st.one_of(st.binary(max_size=40), st.just(b"[" * 5000), st.just(b'{"prompt": NaN}'))
    return st.one_of(
        st.tuples(st.just("completions"), obj),
        st.tuples(st.just("chat/completions"), chat),
        st.tuples(st.sampled_from(["completions", "chat/completions"]), raw),
    )


@pytest.fixture(scope="module")
def fuzz_client(server: Background) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@settings(max_examples=150)
@given(case=bodies())
def test_fuzzed_bodies_are_answered_and_health_stays_up(
    server: Background, fuzz_client: httpx.Client, case: tuple[str, Any]
) -> None:
    route, body = case
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = fuzz_client.post(f"/v1/{route}", content=content)
    assert r.status_code in (200, 400, 404, 413), (r.status_code, r.text)
    if r.status_code != 200:
        error = r.json()["error"]
        assert error["message"] and error["type"] == "invalid_request_error" or r.status_code == 404
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]")
    else:
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    started = time.perf_counter()
    assert fuzz_client.get("/health").status_code == 200
    assert time.perf_counter() - started < 1.0


def test_the_fuzzed_server_is_idle_and_whole_afterwards(server: Background) -> None:
    assert client(server).completions.create(model="tiny", prompt="x", max_tokens=2).usage
    deadline = time.monotonic() + 10
    while HTTP.get(server.url + "/health").json()["outstanding"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)

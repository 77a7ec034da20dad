"""`specdec serve`: the OpenAI-compatible server, talked to with the official
`openai` client on 127.0.0.1. A 2-layer random Llama over SmolLM2's
tokenizer serves (a step takes milliseconds). p = target, q = draft, k = γ.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
import specdec_rs as sd
from serve_fixtures import CONTEXT, HTTP, LONG, MESSAGE, client, model_folder, serve
from specdec_rs import drafters, models
from specdec_rs.cli import main
from specdec_rs.serve import ServerOptions, build_served
from specdec_rs.serve.app import Served
from specdec_rs.serve.server import Background, start_in_thread
from specdec_rs.serve.text import TextAssembler

__all__ = ["model_folder"]  # a fixture: imported to be found, not called


@pytest.fixture(scope="module")
def server(model_folder: Path) -> Iterator[Background]:
    bg = serve(model_folder, max_batch=8, max_queue=40, drafters=("none",), k=None)  # goodput
    yield bg
    bg.stop()


def metrics(bg: Background) -> dict[tuple[str, str], float]:
    """{(series, labels): value} of GET /metrics."""
    out = {}
    for line in HTTP.get(bg.url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            name, _, labels = head.partition("{")
            out[(name, labels.rstrip("}"))] = float(value)
    return out


def total(m: dict[tuple[str, str], float], name: str, where: str = "") -> float:
    return sum(v for (n, labels), v in m.items() if n == name and where in labels)


def idle(bg: Background, timeout: float = 10.0) -> dict[str, Any]:
    """/health once no request runs or waits (fails after `timeout` s)."""
    deadline = time.monotonic() + timeout
    while True:
        h: dict[str, Any] = HTTP.get(bg.url + "/health").json()
        if h["running"] == h["waiting"] == h["outstanding"] == 0:
            return h
        assert time.monotonic() < deadline, f"the server did not return to idle: {h}"
        time.sleep(0.02)


# ---- the basics
def test_completions_chat_models_and_health(server: Background) -> None:
    c = client(server)
    (card,) = c.models.list().data
    assert card.id == "tiny"
    r = c.completions.create(
        model="tiny",
        prompt="the sea the sea",
        max_tokens=10,
        temperature=0,
        extra_body={"speculation": {"k": 3}},  # the goodput γ may be 0 on a loaded host
    )
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 10 and r.usage.prompt_tokens > 0
    spec = r.usage.speculation  # type: ignore[attr-defined]
    assert spec["drafter"] == "prompt-lookup" and spec["num_draft_tokens"] > 0
    assert spec["acceptance_rate"] == 1.0  # greedy copying target: lookup's drafts all pass
    chat = c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": MESSAGE}], max_tokens=8, seed=1
    )
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 8
    assert HTTP.get(server.url + "/health").json()["status"] == "ok"


def test_a_seed_reproduces_its_output(server: Background) -> None:
    c = client(server)

    def text(seed: int) -> str:
        r = c.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": MESSAGE}],
            max_tokens=16,
            temperature=1.0,
            seed=seed,
            extra_body={"ignore_eos": True, "speculation": {"k": 3}},
        )
        return r.choices[0].message.content or ""

    first = text(7)
    assert text(7) == first
    assert len({first, text(8), text(9)}) > 1  # sampling does vary with the seed


def test_a_greedy_stream_equals_specdec_generate(
    server: Background, model_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", MESSAGE, "--model", str(model_folder), "--temperature", "0"]
    assert main([*argv, "--max-new-tokens", "24", "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)["text"]
    stream = client(server).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": MESSAGE}],
        max_tokens=24,
        temperature=0,
        stream=True,
    )
    pieces = [ch.choices[0].delta.content or "" for ch in stream if ch.choices]
    assert "".join(pieces) == expected and len(expected) > 0


def test_stop_strings_end_the_text_before_them(server: Background) -> None:
    c = client(server)
    full = c.completions.create(model="tiny", prompt="a b a b", max_tokens=12, temperature=0)
    text = full.choices[0].text
    stop = text[3:6]  # somewhere inside the greedy text
    assert stop.strip()
    cut = c.completions.create(
        model="tiny", prompt="a b a b", max_tokens=12, temperature=0, stop=[stop, "never"]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < 12


# ---- load
# (endpoint, temperature, top_p, top_k, k, max_tokens, stop). A sampled request
# fixes its γ (k): the goodput policy's γ follows the load, and which exact
# sample a seed gives depends on the rounds' γ (the law does not).
SETTINGS = [
    ("chat", 0.0, None, None, None, 20, None),
    ("chat", 1.0, None, None, 4, 24, None),
    ("text", 0.7, 0.9, None, 2, 12, None),
    ("chat", 0.8, None, 5, 0, 16, None),
    ("text", 1.0, None, None, 1, 8, ["\n"]),
    ("chat", 1.2, 0.95, 40, 3, 24, None),
    ("text", 0.0, None, None, None, 4, None),
    ("chat", 0.5, None, None, 2, 18, ["the"]),
]


def request_of(i: int) -> dict[str, Any]:
    endpoint, temperature, top_p, top_k, k, max_tokens, stop = SETTINGS[i % len(SETTINGS)]
    body: dict[str, Any] = {
        "model": "tiny",
        "temperature": temperature,
        "max_tokens": max_tokens,
        "seed": 100 + i,
    }
    if top_p is not None:
        body["top_p"] = top_p
    if stop is not None:
        body["stop"] = stop
    extra: dict[str, Any] = {"ignore_eos": i % 3 == 0}
    if top_k is not None:
        extra["top_k"] = top_k
    if k is not None:
        extra["speculation"] = {"k": k}
    if i % 5 == 4:
        extra["speculation"] = {"drafter": "none"}
    words = f"request {i}: tell me about {['ships', 'the sea', 'waves', 'ports'][i % 4]}"
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": words}]
    else:
        body["prompt"] = words + " " + words
    return {"endpoint": endpoint, "body": body, "extra": extra}


async def _one(c: openai.AsyncOpenAI, spec: dict[str, Any], stream: bool) -> dict[str, Any]:
    api = c.chat.completions if spec["endpoint"] == "chat" else c.completions
    kwargs = {**spec["body"], "extra_body": spec["extra"]}
    if not stream:
        r = await api.create(**kwargs)  # type: ignore[call-overload]
        choice = r.choices[0]
        text = choice.message.content if spec["endpoint"] == "chat" else choice.text
        return {"text": text, "finish": choice.finish_reason, "usage": r.usage}
    s = await api.create(**kwargs, stream=True, stream_options={"include_usage": True})  # type: ignore[call-overload]
    pieces, finish, usage, chunks = [], [], None, 0
    async for ch in s:
        chunks += 1
        if not ch.choices:
            usage = ch.usage
            continue
        c0 = ch.choices[0]
        piece = c0.delta.content if spec["endpoint"] == "chat" else c0.text
        pieces.append(piece or "")
        if c0.finish_reason is not None:
            finish.append(c0.finish_reason)
    assert len(finish) == 1 and usage is not None, "one finish, then one usage chunk"
    return {"text": "".join(pieces), "finish": finish[0], "usage": usage, "chunks": chunks}


def test_32_concurrent_streams_equal_each_request_alone(server: Background) -> None:
    before = metrics(server)
    rounds_before = server.served.worker.rounds
    specs = [request_of(i) for i in range(32)]

    async def all_at_once() -> list[dict[str, Any]]:
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        async with c:
            return await asyncio.gather(*(_one(c, s, stream=True) for s in specs))

    together = asyncio.run(all_at_once())
    batched_rounds = server.served.worker.rounds - rounds_before
    idle(server)
    after = metrics(server)

    async def one_by_one() -> list[dict[str, Any]]:
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        async with c:
            return [await _one(c, s, stream=False) for s in specs]

    alone = asyncio.run(one_by_one())
    for i, (t, a) in enumerate(zip(together, alone, strict=True)):
        assert t["text"] == a["text"], f"request {i}: batched text differs from alone"
        assert t["finish"] == a["finish"], i
        assert t["usage"].completion_tokens == a["usage"].completion_tokens, i
        # γ (the goodput policy's) depends on the load, the text does not
        assert t["usage"].speculation["drafter"] == a["usage"].speculation["drafter"], i  # type: ignore[attr-defined]
        budget = specs[i]["body"]["max_tokens"]
        assert t["finish"] == "stop" or t["usage"].completion_tokens == budget, i
    usages = [t["usage"] for t in together]
    spec = [u.speculation for u in usages]  # type: ignore[attr-defined]
    row_rounds = sum(s["rounds"] for s in spec)
    assert batched_rounds < row_rounds / 2, "the rows shared their target passes"
    assert {s["drafter"] for s in spec} == {"prompt-lookup", "none"}

    def delta(name: str, where: str = "") -> float:
        return total(after, name, where) - total(before, name, where)

    assert delta("vllm:request_success_total") == 32
    assert delta("vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert delta("vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta("vllm:spec_decode_num_drafts_total") == sum(s["num_drafts"] for s in spec)
    drafted = sum(s["num_draft_tokens"] for s in spec)
    accepted = sum(s["num_accepted_tokens"] for s in spec)
    assert delta("vllm:spec_decode_num_draft_tokens_total") == drafted > 0
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == accepted > 0
    assert delta("vllm:spec_decode_num_accepted_tokens_per_pos_total") == accepted
    assert delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", 'position="0"') == sum(
        (s["accepted_per_position"] or [0])[0] for s in spec
    )
    assert delta("specdec:spec_decode_rounds_total") == row_rounds
    # the policy chose for every row round of the requests that fixed neither γ nor drafter
    chosen = sum(
        s["rounds"] for s, sp in zip(spec, specs, strict=True) if "speculation" not in sp["extra"]
    )
    assert delta("specdec:goodput_row_rounds_total") == chosen > 0
    assert delta("specdec:goodput_probes_total") <= chosen
    assert total(after, "specdec:goodput_predicted_tokens_per_second") > 0
    assert total(after, "specdec:goodput_measured_tokens_per_second") >= 0
    assert delta("vllm:time_to_first_token_seconds_count") == 32
    assert (
        total(after, "vllm:num_requests_running") == total(after, "vllm:num_requests_waiting") == 0
    )


# ---- refusals
BAD = [
    (b"{not json", "request body is not JSON", None),
    (b"[" * 100_000, "request body is not strict JSON", None),
    (b'{"prompt": NaN}', "NaN is not a JSON number", None),
    (b"[1, 2]", "JSON list", None),
    (json.dumps({"prompt": "x", "max_tokens": -3}).encode(), "max_tokens", "max_tokens"),
    (json.dumps({"prompt": "x", "max_tokens": "8"}).encode(), "valid integer", "max_tokens"),
    (json.dumps({"prompt": "x", "temperature": 2.5}).encode(), "temperature", "temperature"),
    (json.dumps({"prompt": "x", "top_p": 0}).encode(), "top_p", "top_p"),
    (json.dumps({"prompt": "x", "temperature": "hot"}).encode(), "valid number", "temperature"),
    (json.dumps({"prompt": "x", "colour": 3}).encode(), "colour", "colour"),
    (json.dumps({"prompt": "x", "n": 2}).encode(), "n", "n"),
    (json.dumps({"prompt": "x", "presence_penalty": 0.5}).encode(), "presence_penalty", None),
    (json.dumps({"max_tokens": 4}).encode(), "prompt", None),
    (
        json.dumps({"prompt": "x", "speculation": {"drafter": "eagle"}}).encode(),
        "not served here",
        "speculation.drafter",
    ),
    (json.dumps({"prompt": "x", "speculation": {"k": -1}}).encode(), "speculation.k", None),
    (json.dumps({"prompt": "x", "max_tokens": CONTEXT}).encode(), "context", "max_tokens"),
    (json.dumps({"prompt": [], "max_tokens": 4}).encode(), "prompt", None),
    (json.dumps({"prompt": [10**9], "max_tokens": 4}).encode(), "outside [0, 49152)", None),
]


@pytest.mark.parametrize(("body", "says", "param"), BAD)
def test_a_bad_request_is_a_400_and_the_server_goes_on(
    server: Background, body: bytes, says: str, param: str | None
) -> None:
    r = HTTP.post(
        server.url + "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and says in error["message"], error
    if param is not None:
        assert error["param"] == param
    ok = client(server).completions.create(model="tiny", prompt="go on", max_tokens=2)
    assert ok.usage.completion_tokens == 2


def test_a_bug_is_a_500_with_an_error_body(
    server: Background, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specdec_rs.serve import app

    def broken(served: Any, body: Any) -> list[int]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(app, "prompt_ids", broken)
    r = HTTP.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 500 and "RuntimeError: a bug" in r.json()["error"]["message"]
    monkeypatch.undo()
    assert client(server).completions.create(model="tiny", prompt="x", max_tokens=2).usage
    assert idle(server)["outstanding"] == 0


def test_chat_refusals_and_other_models(server: Background) -> None:
    c = client(server)
    with pytest.raises(openai.BadRequestError, match="messages"):
        c.chat.completions.create(model="tiny", messages=[], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="role"):
        c.chat.completions.create(
            model="tiny",
            messages=[{"role": "robot", "content": "hi"}],  # type: ignore[misc,list-item]
            max_tokens=4,
        )
    with pytest.raises(openai.BadRequestError, match="context_length_exceeded|context"):
        c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi " * CONTEXT}]
        )
    with pytest.raises(openai.NotFoundError, match="not served here"):
        c.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    r = HTTP.get(server.url + "/v2/nothing")
    assert r.status_code == 404 and "error" in r.json()
    assert total(metrics(server), "specdec:requests_rejected_total", 'reason="not_found"') >= 1


def test_a_full_queue_answers_429(model_folder: Path) -> None:
    bg = serve(model_folder, max_batch=1, max_queue=1)
    try:
        body = {"model": "tiny", "prompt": "x y", "max_tokens": LONG, "ignore_eos": True}
        body["stream"] = True
        c = client(bg)
        with HTTP.stream("POST", bg.url + "/v1/completions", json=body) as first:
            lines = first.iter_lines()  # kept: a dropped iterator closes the stream
            assert next(lines).startswith("data: ")
            with HTTP.stream("POST", bg.url + "/v1/completions", json=body):
                idle_until(bg, lambda h: h["waiting"] == 1)
                with pytest.raises(openai.RateLimitError, match="queue is full"):
                    c.completions.create(model="tiny", prompt="x", max_tokens=2)
        idle(bg)
        assert c.completions.create(model="tiny", prompt="x", max_tokens=2).usage.completion_tokens
        assert total(metrics(bg), "specdec:requests_rejected_total", 'reason="queue_full"') == 1
    finally:
        bg.stop()


def test_a_client_that_leaves_frees_its_row(model_folder: Path) -> None:
    bg = serve(model_folder, max_batch=1, max_queue=4)
    try:
        body = {"model": "tiny", "prompt": "x y", "max_tokens": LONG, "ignore_eos": True}
        with HTTP.stream("POST", bg.url + "/v1/completions", json={**body, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            # a second one waits in the queue, and leaves too
            with HTTP.stream("POST", bg.url + "/v1/completions", json={**body, "stream": True}):
                waiting = idle_until(bg, lambda h: h["waiting"] == 1)
                assert waiting["running"] == 1
        idle(bg)
        with pytest.raises(httpx.ReadTimeout):  # a non-streamed request whose client gives up
            HTTP.post(bg.url + "/v1/completions", json=body, timeout=0.5)
        idle(bg)
        assert total(metrics(bg), "vllm:request_success_total", 'finished_reason="abort"') == 3
    finally:
        bg.stop()


def idle_until(bg: Background, ok: Any, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        h: dict[str, Any] = HTTP.get(bg.url + "/health").json()
        if ok(h):
            return h
        assert time.monotonic() < deadline, h
        time.sleep(0.02)


def test_sigterm_drains_the_running_requests_and_stops(model_folder: Path) -> None:
    """`specdec serve` in its own process: SIGTERM lets a running request
    finish whole, cuts one past --drain-timeout with one line (its stream
    ends with a shutdown error and [DONE]), counts the cut apart from the
    answered, and exits 0."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SPECDEC_API_KEY", None)
    argv = [sys.executable, "-m", "specdec_rs", "serve", "--model", str(model_folder)]
    argv += ["--port", "0", "--log-level", "warning", "--served-model-name", "tiny", "--k", "2"]
    argv += ["--drain-timeout", str(DRAIN_TIMEOUT)]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert " on http://127.0.0.1:" in line, line + (proc.stderr.read() if proc.stderr else "")
        assert "; no authentication)" in line, line
        url = line.split(" on ")[1].split("/v1")[0]
        got: dict[str, list[str]] = {}

        def stream(name: str, max_tokens: int) -> None:
            body = {"model": "tiny", "prompt": "a b", "max_tokens": max_tokens, "stream": True}
            body["ignore_eos"] = True
            body["stream_options"] = {"include_usage": True}
            with HTTP.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                got[name] = [x for x in r.iter_lines() if x]

        threads = [
            threading.Thread(target=stream, args=("whole", WHOLE)),
            threading.Thread(target=stream, args=("cut", LONG_CUT)),
        ]
        for t in threads:
            t.start()
        idle_until_url(url, lambda h: h["running"] == 2)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert proc.wait(60) == 0
        out, err = proc.communicate()
        whole = got["whole"]
        assert whole[-1] == "data: [DONE]"
        usage = json.loads(whole[-2][6:])["usage"]
        assert usage["completion_tokens"] == WHOLE  # the running request finished whole
        cut = got["cut"]
        assert cut[-1] == "data: [DONE]" and '"code":"shutdown"' in cut[-2], cut[-2:]
        assert "stopped; 1 requests answered" in out and "; 1 cut unfinished" in out, out
        assert "Traceback" not in err and "cut unfinished by the drain timeout" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()  # closes the pipes


WHOLE = 64  # tokens: under a second of decoding on a loaded host
DRAIN_TIMEOUT = 2  # s: several times WHOLE's, far less than LONG_CUT's
LONG_CUT = 12000  # tokens: far more than DRAIN_TIMEOUT seconds of decoding


def idle_until_url(url: str, ok: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok(HTTP.get(url + "/health").json()):
        assert time.monotonic() < deadline
        time.sleep(0.01)


# ---- the pieces
def test_the_engine_takes_a_drafter_by_name() -> None:
    target = models.tiny_llama(num_layers=2)
    engine = sd.BatchEngine(target, sd.PromptLookup, drafters={"lookup": sd.PromptLookup})
    with pytest.raises(ValueError, match="request 0: drafter 'eagle' is not one of"):
        engine.submit(sd.Request([5, 6, 7], 4, drafter="eagle"))
    a = engine.submit(sd.Request([5, 6, 7, 5, 6], 6, temperature=0, eos_token_id=[]))
    b = engine.submit(
        sd.Request([5, 6, 7, 5, 6], 6, temperature=0, eos_token_id=[], drafter="none")
    )
    seen: list[tuple[int, int]] = []
    engine.on_commit = lambda rid, r, ids: seen.append((rid, len(ids)))
    done = {}
    while engine.active or engine.queued:
        done.update({f.id: f for f in engine.step()})
    assert done[a].result.tokens == done[b].result.tokens  # type: ignore[union-attr]
    assert done[b].result.drafter == "none" and done[a].result.drafter == "prompt-lookup"  # type: ignore[union-attr]
    assert sum(n for rid, n in seen if rid == a) == 6 == sum(n for rid, n in seen if rid == b)
    with pytest.raises(ValueError, match="drafters is a list"):
        sd.BatchEngine(target, None, drafters=[sd.PromptLookup])  # type: ignore[arg-type]


def test_rows_share_what_a_drafter_shares_across_requests(model_folder: Path) -> None:
    """The server builds each drafter once and gives each row `fresh()` of
    it; a drafter that learns across requests keeps what its fresh copies share."""

    class Remembering(sd.PromptLookup):
        def __init__(self, seen: list[int] | None = None) -> None:
            super().__init__()
            self.seen = [] if seen is None else seen

        def fresh(self) -> Remembering:
            return Remembering(self.seen)

        def start(self, seq: Any, target_cache: Any, target_hidden: Any) -> None:
            self.seen.append(len(seq))
            super().start(seq, target_cache, target_hidden)

    target, tokenizer = models.load_local(model_folder)
    shared = Remembering()
    served = build_served(target, tokenizer, ServerOptions(port=0, log_level="warning", k=2))
    engine = served.worker.engine
    engine.drafters["prompt-lookup"] = engine.factory = drafters.copies(shared)
    bg = start_in_thread(served)
    try:
        c = client(bg)
        for prompt in ("one two", "three four five"):
            c.completions.create(model=served.model_name, prompt=prompt, max_tokens=3)
        assert len(shared.seen) == 2  # both requests' rows started views of the one drafter
    finally:
        bg.stop()


def test_the_suffix_drafter_learns_across_the_servers_requests(model_folder: Path) -> None:
    bg = serve(model_folder, drafter="suffix")
    try:
        c = client(bg)
        texts = [
            c.completions.create(model="tiny", prompt=p, max_tokens=6, temperature=0)
            .choices[0]
            .text
            for p in ("one two three", "four five")
        ]
        shared = bg.served.built["suffix"].shared
        assert len(shared.sequences) == 2 and all(len(s) > 0 for s in shared.sequences)
        tokenizer = bg.served.tokenizer
        assert [tokenizer.decode(s) for s in shared.sequences] == texts  # both outputs, in order
    finally:
        bg.stop()


def test_lookahead_requests_give_target_onlys_greedy_text(model_folder: Path) -> None:
    """Requests drafting with lookahead (its window in each row's forward,
    the row run beside the others') stream target-only's greedy text."""
    bg = serve(model_folder, drafter="lookahead", drafters=("lookahead:2,3,2",))
    try:
        c = client(bg)
        texts: dict[str, list[str]] = {}
        drafts = 0
        for drafter in ("none", "lookahead", "lookahead:2,3,2"):
            texts[drafter] = []
            for prompt in ("one two one two one", "three four"):
                r = c.completions.create(
                    model="tiny",
                    prompt=prompt,
                    max_tokens=12,
                    temperature=0,
                    extra_body={"speculation": {"drafter": drafter, "k": 2}},
                )
                texts[drafter].append(r.choices[0].text)
                spec = r.usage.speculation  # type: ignore[union-attr]
                assert spec["drafter"] == drafter
                drafts += spec["num_draft_tokens"] if drafter != "none" else 0
        assert texts["lookahead"] == texts["none"] == texts["lookahead:2,3,2"]
        assert drafts > 0
    finally:
        bg.stop()


def test_text_assembler_holds_back_what_may_become_a_stop() -> None:
    class Chars:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return "".join(map(chr, ids))

    a = TextAssembler(Chars(), ["<end>"])
    assert a.feed([ord(c) for c in "hello <e"]) == "hello "
    assert a.feed([ord(c) for c in "x"]) == "<ex"  # not a stop after all
    assert a.feed([ord(c) for c in "<en"]) == ""
    assert a.feed([ord(c) for c in "d>tail"]) == "" and a.stopped
    assert a.text == "hello <ex" and a.tokens == 9 + 5
    b = TextAssembler(Chars(), [])
    assert b.feed([ord("a"), 0xFFFD]) == ""  # an unfinished character waits, with its window
    assert b.feed([ord("b")]) == "a\ufffdb"
    assert b.feed([0xFFFD]) == "" and b.finish() == "\ufffd"


def test_text_assembler_equals_one_decode(model_folder: Path) -> None:
    """Decoded round by round (1..5 ids at a time), the text is the whole
    output's decode, multi-byte characters included."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    ids = tokenizer("naïve café — 東京 🌊 waves, and 'quotes'.")["input_ids"] * 3
    a = TextAssembler(tokenizer, [])
    out, i, n = [], 0, 1
    while i < len(ids):
        out.append(a.feed(ids[i : i + n]))
        i, n = i + n, n % 5 + 1
    out.append(a.finish())
    assert "".join(out) == tokenizer.decode(ids, skip_special_tokens=True)
    stopped = TextAssembler(tokenizer, ["東京"])
    assert stopped.feed(ids) == "naïve café — " and stopped.stopped
    assert tokenizer.decode(ids[: stopped.tokens]).endswith("東京")
    assert not tokenizer.decode(ids[: stopped.tokens - 1]).endswith("東京")


def test_an_api_key_is_required_when_set(model_folder: Path) -> None:
    bg = serve(model_folder, api_key="s3cret")
    try:
        wrong = openai.OpenAI(base_url=bg.url + "/v1", api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="API key"):
            wrong.completions.create(model="tiny", prompt="x", max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=bg.url + "/v1", api_key="s3cret", max_retries=0)
        assert right.completions.create(model="tiny", prompt="x", max_tokens=2).usage
        assert HTTP.get(bg.url + "/health").status_code == 200  # probes need no key
    finally:
        bg.stop()


@pytest.mark.slow
def test_smollm2_greedy_stream_equals_specdec_generate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The real target (GGUF, the Rust batch path, its chat template)."""
    assert (
        main(["generate", MESSAGE, "--temperature", "0", "--max-new-tokens", "24", "--json"]) == 0
    )
    expected = json.loads(capsys.readouterr().out)["text"]
    target, tokenizer = models.load_smollm2()
    opts = ServerOptions(port=0, log_level="warning", k=3)
    bg = start_in_thread(build_served(target, tokenizer, opts), opts)
    try:
        stream = client(bg).chat.completions.create(
            model=opts.model_name,
            messages=[{"role": "user", "content": MESSAGE}],
            max_tokens=24,
            temperature=0,
            stream=True,
        )
        text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        assert text == expected and len(text) > 20
    finally:
        bg.stop()


def test_draining_answers_503_and_the_default_host_is_loopback(server: Background) -> None:
    from specdec_rs.cli import build_parser

    served: Served = server.served
    assert served.outstanding == 0 and served.worker.alive
    served.draining = True
    try:
        with pytest.raises(openai.InternalServerError, match="shutting down"):
            client(server).completions.create(model="tiny", prompt="x", max_tokens=2)
        assert HTTP.get(server.url + "/health").status_code == 503
    finally:
        served.draining = False
    assert HTTP.get(server.url + "/health").json()["status"] == "ok"
    args = build_parser().parse_args(["serve"])
    assert args.host == ServerOptions().host == "127.0.0.1"
    with pytest.raises(ValueError, match="--max-batch"):
        ServerOptions(max_batch=0).check()
    with pytest.raises(ValueError, match="drafter 'nope' is not understood"):
        ServerOptions(drafter="nope").check()


@pytest.fixture(scope="module")
def served_gguf(model_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The served test model written as a GGUF file (the Rust batch path:
    chunked prefill and the prefix cache), and its tokenizer."""
    from specdec_rs.gguf import load_gguf
    from specdec_rs.gguf.writer import write_llama

    folder_model, tokenizer = models.load_local(model_folder)
    path = tmp_path_factory.mktemp("served-gguf") / "served.gguf"
    write_llama(folder_model, path, linear_type="Q8_0", embed_type="Q8_0")
    return load_gguf(path, tokenizer=False)[0], tokenizer


def gguf_server(served_gguf: Any, **options: Any) -> Background:
    target, tokenizer = served_gguf
    opts = ServerOptions(port=0, log_level="warning", model_name="tiny", k=2, **options)
    return start_in_thread(build_served(target, tokenizer, opts), opts)


def test_concurrent_requests_prefilled_in_chunks_equal_each_alone(served_gguf: Any) -> None:
    """A GGUF target (the rounds' chunked prefill): 6 concurrent streams of
    prompts 1..~260 tokens, greedy and sampled with seeds, while others
    decode, give the text each gives alone on a server that prefills at the
    join (prefill_chunk=0)."""
    from concurrent.futures import ThreadPoolExecutor

    words = "the sea and the sky and a ship " * 40
    asks = [
        (words[: 8 * n], t, seed)
        for n, t, seed in (
            (1, 0.0, 1),
            (130, 0.8, 2),
            (3, 0.0, 3),
            (60, 0.8, 4),
            (20, 0.0, 5),
            (6, 1.0, 6),
        )
    ]

    def ask(bg: Background, prompt: str, t: float, seed: int) -> str:
        out = client(bg).completions.create(
            model="tiny", prompt=prompt, max_tokens=12, temperature=t, seed=seed
        )
        return out.choices[0].text

    texts = {}
    for chunk in (8, 0):
        bg = gguf_server(served_gguf, prefill_chunk=chunk, prefix_cache_mb=0)
        try:
            assert bg.served.worker.engine.chunked == (chunk > 0)
            if chunk:
                with ThreadPoolExecutor(len(asks)) as pool:
                    texts[chunk] = list(pool.map(ask, [bg] * len(asks), *zip(*asks, strict=True)))
            else:
                texts[chunk] = [ask(bg, *a) for a in asks]
        finally:
            bg.stop()
    assert texts[8] == texts[0]
    assert any(texts[0])


def metric(bg: Background, name: str) -> float:
    for line in HTTP.get(bg.url + "/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_prefix_cache_hits_in_usage_and_metrics_under_32_streams(served_gguf: Any) -> None:
    """32 concurrent chats sharing the template's preamble and a long system
    message (some asked twice): usage.prompt_tokens_details.cached_tokens
    adds up to vllm:prefix_cache_hits_total and the prompt tokens to
    vllm:prefix_cache_queries_total; every answer equals a server's without
    a prefix cache; a tiny cache evicts and still answers the same."""
    from concurrent.futures import ThreadPoolExecutor

    system = {"role": "system", "content": "You answer briefly about the sea. " * 12}
    chats = [
        [system, {"role": "user", "content": f"Question {i % 20}: tell me about ship {i % 20}"}]
        for i in range(32)
    ]

    def ask(bg: Background, messages: Any) -> tuple[str, int, int]:
        out = client(bg).chat.completions.create(
            model="tiny", messages=messages, max_tokens=6, temperature=0
        )
        details = out.usage.prompt_tokens_details
        return out.choices[0].message.content, out.usage.prompt_tokens, details.cached_tokens

    answers = {}
    for mb in (0, 64, 0.2):
        bg = gguf_server(served_gguf, prefix_cache_mb=mb, max_batch=8)
        try:
            assert (bg.served.worker.engine.prefix is None) == (mb == 0)
            with ThreadPoolExecutor(32) as pool:
                answers[mb] = list(pool.map(ask, [bg] * 32, chats))
            if mb:
                assert metric(bg, "vllm:prefix_cache_hits_total") == sum(c for *_, c in answers[mb])
                assert metric(bg, "vllm:prefix_cache_queries_total") == sum(
                    n for _, n, _ in answers[mb]
                )
        finally:
            bg.stop()
    assert [a for a, *_ in answers[64]] == [a for a, *_ in answers[0]]
    assert [a for a, *_ in answers[0.2]] == [a for a, *_ in answers[0]]
    assert all(c == 0 for *_, c in answers[0])
    assert sum(c > 0 for *_, c in answers[64]) >= 24  # all but the first wave's

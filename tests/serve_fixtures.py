"""The served test model and how to start a server on it, shared by the
server's test modules. A 2-layer random Llama over SmolLM2's tokenizer
serves (a step takes milliseconds). p = target, q = draft, k = γ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
from specdec_rs import models
from specdec_rs.serve import ServerOptions, build_served
from specdec_rs.serve.server import Background, start_in_thread

CONTEXT = 16384
LONG = 12000  # tokens: a request that runs for seconds
MESSAGE = "Write a short poem about the sea, and then another one."

# One client for the tests' plain requests (making a client costs ~30 ms, its
# SSL context); no keep-alive, so no connection outlives its server.
HTTP = httpx.Client(timeout=5.0, limits=httpx.Limits(max_keepalive_connections=0))


@pytest.fixture(scope="session")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The served test model, saved once per test process in a fresh folder
    (see `save_model`); the tests only read it."""
    return save_model(tmp_path_factory.mktemp("served-model"))


def save_model(folder: Path) -> Path:
    """A local model folder: a 2-layer random Llama whose LM head is its
    embedding (scaled by 4): greedy repeats the last token (prompt lookup's
    drafts are accepted), sampling at T = 1 still varies."""
    import torch
    from specdec_rs.gguf.model import tokenizer_for

    # SmolLM2's tokenizer as `load_smollm2` reads it, without building its weights (0.4 s)
    tokenizer = tokenizer_for(models.smollm2_gguf(), models.cache_dir())
    model = models.tiny_llama(vocab_size=len(tokenizer), hidden_size=64, num_layers=2, seed=0)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight * 4)
    model.config.max_position_embeddings = CONTEXT  # room for long requests
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def serve(folder: Path, **options: Any) -> Background:
    """A server on `folder`'s model (a fixed γ = 2 unless told: no forward profile to take)."""
    target, tokenizer = models.load_local(folder)
    options = {"k": 2, **options}
    opts = ServerOptions(port=0, log_level="warning", model_name="tiny", **options)
    return start_in_thread(build_served(target, tokenizer, opts), opts)


def client(bg: Background) -> openai.OpenAI:
    """The official client on `bg`, over the shared `HTTP` transport."""
    return openai.OpenAI(
        base_url=bg.url + "/v1", api_key="unused", max_retries=0, http_client=OPENAI_HTTP
    )


# the official client's own transport (its default timeout), made once
OPENAI_HTTP = openai.DefaultHttpxClient(limits=httpx.Limits(max_keepalive_connections=0))

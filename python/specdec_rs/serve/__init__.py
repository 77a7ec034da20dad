"""`specdec serve`: an OpenAI-compatible server over the batched engine.
p = target, q = draft, k = γ.

- `protocol`: the request bodies (pydantic) and the error body;
- `text`: token ids to streamed text, with stop strings;
- `worker`: the `BatchEngine` on its own thread (continuous batching);
- `metrics`: the Prometheus series (vLLM's names where vLLM has them);
- `app`: the Starlette routes;
- `server`: building all of it from a model and drafter specs, and running
  it under uvicorn (SIGTERM drains the running requests, then stops).
"""

from specdec_rs.serve.server import ServerOptions, build_served, run_server

__all__ = ["ServerOptions", "build_served", "run_server"]

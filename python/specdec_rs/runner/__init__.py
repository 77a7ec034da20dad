"""Every target forward, in one home.

- `lone`: one sequence: a block after its cache (`forward`,
  `forward_with_hidden`), a draft tree under its mask (`forward_tree`);
- `batch`: the rows of a batch round in one pass, by a `Backend` per kind of
  target (`backend_of`: a GGUF stack, a transformers Llama, any other model);
- `stack`: a GGUF model's whole decoder stack in one Rust call, the path both
  of the above take for a GGUF target on the CPU;
- `cache`: the cache a forward writes (`new_cache`, `crop`, `keep_positions`).
"""

from specdec_rs.runner.batch import Backend, backend_of
from specdec_rs.runner.cache import crop, keep_positions, new_cache
from specdec_rs.runner.lone import forward, forward_tree, forward_with_hidden

__all__ = [
    "Backend",
    "backend_of",
    "crop",
    "forward",
    "forward_tree",
    "forward_with_hidden",
    "keep_positions",
    "new_cache",
]

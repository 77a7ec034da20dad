"""GGUF files at their own precision: a fast, checked reader (`reader`),
torch modules over quantized weights (`modules`) and the Llama model built
from a file (`model.load_gguf`). p = target, q = draft."""

from specdec_rs.gguf.model import load_gguf
from specdec_rs.gguf.modules import QuantEmbedding, QuantLinear

__all__ = ["QuantEmbedding", "QuantLinear", "load_gguf"]

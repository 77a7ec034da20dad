"""Which target a head or a data folder was made for. p = target, q = draft.

Two records, for two jobs:

- `fingerprint(target)`: 16 hex digits, an exact identity for the training
  data's manifest (data made from one load of one model). It covers the
  config's sizes and 16 rows of the embedding and the LM head rounded to
  bfloat16, so a float32 and a bfloat16 load agree; it does not cover the
  decoder layers. Head files written before `TargetPrint` carry it too.
- `TargetPrint.of(target)`: what a head file records. It covers the config's
  sizes and 8 evenly spaced values of every weight tensor: the decoder
  layers, the norms, the embedding and the LM head. It is matched with a
  tolerance (2^-7 relative) that float32, bfloat16 and float16 loads of one
  model meet: each rounds a weight by at most 2^-9 relative. A hash of
  rounded values cannot do that, since a float16 weight rounded to bfloat16
  can land one step away from the float32 weight rounded to bfloat16.
  Another model misses it: another fine-tune moves most weights by more.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from specdec_rs._files import Fields

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CONFIG_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
)
SAMPLES = 8  # values per weight tensor
REL_TOL = 2.0**-7
ABS_TOL = 2.0**-20  # float16 keeps weights below 2^-24 only as subnormals, or as 0
MAX_TENSORS = 100_000


def _config_digest(target: PreTrainedModel) -> hashlib._Hash:
    config = {key: getattr(target.config, key, None) for key in CONFIG_KEYS}
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode())


def fingerprint(target: PreTrainedModel) -> str:
    """16 hex digits naming the target exactly (see the module docs)."""
    from specdec_rs import models

    digest = _config_digest(target)
    vocab = models.vocab_of(target)
    picked = torch.arange(0, vocab, max(1, vocab // 16))
    for module in (target.get_input_embeddings(), target.get_output_embeddings()):
        rows = models.weight_rows(module, picked).to("cpu", torch.bfloat16)
        digest.update(rows.view(torch.int16).numpy().tobytes())
    return str(digest.hexdigest()[:16])


def _flat_sample(numel: int) -> list[int]:
    count = min(SAMPLES, numel)
    return [i * (numel - 1) // max(1, count - 1) for i in range(count)]


def weight_samples(target: Any) -> dict[str, list[float]]:
    """name -> SAMPLES values of every weight at evenly spaced flat indices,
    named as transformers names the parameters. Modules that hold weights
    in another form (a GGUF model's) say so with `print_weights()`: name ->
    (rows, columns, a function from row ids to those float rows, an identity
    that ties share)."""
    samples: dict[str, list[float]] = {}
    seen: set[Any] = set()
    covered: set[int] = set()
    for prefix, module in target.named_modules():
        described = getattr(module, "print_weights", None)
        if not callable(described):
            continue
        covered.update(id(p) for p in module.parameters())
        for key, (rows, cols, read, ident) in described().items():
            if ident in seen:
                continue
            seen.add(ident)
            index = _flat_sample(rows * cols)
            values = read(torch.tensor([i // cols for i in index]))
            picked = values[torch.arange(len(index)), torch.tensor([i % cols for i in index])]
            samples[f"{prefix}.{key}" if prefix else key] = picked.to(torch.float32).tolist()
    for name, weight in target.named_parameters():
        if id(weight) in covered or weight.numel() == 0:
            continue
        flat = weight.detach().reshape(-1)
        values = flat[torch.tensor(_flat_sample(flat.numel()), device=flat.device)]
        samples[name] = values.to("cpu", torch.float32).tolist()
    return samples


@dataclass(frozen=True)
class TargetPrint:
    """config: 16 hex digits of the config's sizes; samples: parameter name
    -> SAMPLES values (float32 as Python floats) at evenly spaced flat indices."""

    config: str
    samples: dict[str, list[float]]

    @classmethod
    def of(cls, target: PreTrainedModel) -> TargetPrint:
        return cls(_config_digest(target).hexdigest()[:16], weight_samples(target))

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "samples": self.samples}

    @classmethod
    def from_json(cls, fields: Fields) -> TargetPrint:
        """A print read from a file's header (`fields` at its "target" object)."""
        config = fields.string("config")
        raw = fields.mapping("samples").obj
        ok = 0 < len(raw) <= MAX_TENSORS and all(
            isinstance(v, list)
            and 0 < len(v) <= SAMPLES
            and all(
                isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                for x in v
            )
            for v in raw.values()
        )
        if not ok:
            raise ValueError(
                f"{fields.path}: field {fields.where}.samples must map each weight's name to "
                f"1..{SAMPLES} finite numbers; {fields.fix}"
            )
        return cls(config, {k: [float(x) for x in v] for k, v in raw.items()})

    def mismatch(self, other: TargetPrint) -> str | None:
        """Why `other` (a target's print) is not this print's model, or None."""
        if other.config != self.config:
            return "its config's sizes differ"
        if other.samples.keys() != self.samples.keys():
            missing = sorted(self.samples.keys() - other.samples.keys())
            extra = sorted(other.samples.keys() - self.samples.keys())
            return f"its weights differ by name (missing {missing[:2]}, new {extra[:2]})"
        for name, mine in self.samples.items():
            theirs = other.samples[name]
            if len(theirs) != len(mine):
                return f"{name} has another size"
            for a, b in zip(mine, theirs, strict=True):
                if abs(a - b) > REL_TOL * max(abs(a), abs(b)) + ABS_TOL:
                    return f"{name} holds {b:.6g} where the head's target held {a:.6g}"
        return None

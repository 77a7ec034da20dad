"""Drafters: cheap proposers of k tokens. p = target, q = draft, k = γ.

One module per drafter; each class registers its command-line name once
(`registry.register`), so adding a drafter means writing one class. See
`base` for the interface the loop and the analysis use.
"""

from specdec_rs.drafters.base import Drafter, ModelDrafter, TeacherForced, copies, gated
from specdec_rs.drafters.draft import Draft, TreeDraft
from specdec_rs.drafters.eagle import Eagle
from specdec_rs.drafters.early_exit import EarlyExit
from specdec_rs.drafters.hybrid import Hybrid
from specdec_rs.drafters.lookahead import Lookahead, NgramPool
from specdec_rs.drafters.lookup import PromptLookup, lookup
from specdec_rs.drafters.medusa import Medusa
from specdec_rs.drafters.model import DraftModel, Truncated
from specdec_rs.drafters.registry import REGISTRY, from_spec, parse_spec, spec_help, split_specs
from specdec_rs.drafters.suffix import SuffixDrafter, SuffixIndex

__all__ = [
    "REGISTRY",
    "Draft",
    "DraftModel",
    "Eagle",
    "Drafter",
    "EarlyExit",
    "Hybrid",
    "Lookahead",
    "Medusa",
    "ModelDrafter",
    "NgramPool",
    "PromptLookup",
    "SuffixDrafter",
    "SuffixIndex",
    "TeacherForced",
    "TreeDraft",
    "Truncated",
    "copies",
    "from_spec",
    "gated",
    "lookup",
    "parse_spec",
    "spec_help",
    "split_specs",
]

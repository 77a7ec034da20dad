"""Trained draft heads on a frozen target: the EAGLE-style head (one decoder
layer over the target's features) and Medusa heads (residual blocks on the
last feature), both decoded through the target's LM-head rows of a reduced
draft vocabulary. p = target, q = draft. The drafters that use them live in
`specdec_rs.drafters` (eagle, medusa, hybrid); training in `specdec_rs.training`.
"""

from specdec_rs.heads.eagle import EagleHead
from specdec_rs.heads.files import load, save, shipped
from specdec_rs.heads.identity import TargetPrint, fingerprint
from specdec_rs.heads.layer import DecoderLayer, LayerShape
from specdec_rs.heads.medusa import MedusaHeads

__all__ = [
    "DecoderLayer",
    "EagleHead",
    "LayerShape",
    "MedusaHeads",
    "TargetPrint",
    "fingerprint",
    "load",
    "save",
    "shipped",
]

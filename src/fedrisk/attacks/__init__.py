"""Byzantine attacks: the :class:`Attack` hook and the standard attacks named in ``[attack]``."""

from fedrisk.attacks.adaptive import MaxNorm, Mimic, NonFiniteAttack, OptALIE, OptIPM, line_maximize
from fedrisk.attacks.base import Attack
from fedrisk.attacks.standard import (
    ALIE,
    IPM,
    GaussianAttack,
    LabelFlipAttack,
    SameValueAttack,
    SignFlipAttack,
    ZeroAttack,
    alie_z,
)
from fedrisk.registry import Registry

ATTACKS: Registry = Registry("attack")
ATTACKS.add("gaussian", GaussianAttack, "scale * N(0, I) replies, redrawn every round")
ATTACKS.add("sign_flip", SignFlipAttack, "-scale x the client's own reply")
ATTACKS.add("alie", ALIE, "a little is enough: honest mean - z x honest std (omniscient)")
ATTACKS.add("ipm", IPM, "inner-product manipulation: -epsilon x honest mean (omniscient)")
ATTACKS.add("zero", ZeroAttack, "all-zero replies")
ATTACKS.add("same_value", SameValueAttack, "replies with every entry equal to value")
ATTACKS.add("max_norm", MaxNorm, "defence-aware: the largest admitted message along -honest mean (omniscient)")
ATTACKS.add("opt_ipm", OptIPM, "IPM with epsilon line-searched per round against the defence (omniscient)")
ATTACKS.add("opt_alie", OptALIE, "ALIE with z line-searched per round against the defence (omniscient)")
ATTACKS.add("mimic", Mimic, "copy the honest reply that maximises heterogeneity bias (omniscient)")
ATTACKS.add("nonfinite", NonFiniteAttack, "NaN / inf replies (value = 'nan', 'inf' or '-inf')")
ATTACKS.add("label_flip", LabelFlipAttack, "data attack: labels y -> C - 1 - y on the Byzantine clients")

__all__ = [
    "ALIE",
    "ATTACKS",
    "IPM",
    "Attack",
    "GaussianAttack",
    "LabelFlipAttack",
    "MaxNorm",
    "Mimic",
    "NonFiniteAttack",
    "OptALIE",
    "OptIPM",
    "SameValueAttack",
    "SignFlipAttack",
    "ZeroAttack",
    "alie_z",
    "line_maximize",
]

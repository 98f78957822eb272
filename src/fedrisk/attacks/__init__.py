"""Byzantine attacks: the :class:`Attack` hook and the standard attacks named in ``[attack]``."""

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
ATTACKS.add("label_flip", LabelFlipAttack, "data attack: labels y -> C - 1 - y on the Byzantine clients")

__all__ = [
    "ALIE",
    "ATTACKS",
    "IPM",
    "Attack",
    "GaussianAttack",
    "LabelFlipAttack",
    "SameValueAttack",
    "SignFlipAttack",
    "ZeroAttack",
    "alie_z",
]

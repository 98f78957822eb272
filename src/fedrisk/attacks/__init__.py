"""Byzantine attacks: the :class:`Attack` hook and the standard attacks named in ``[attack]``."""

from fedrisk.attacks.base import Attack
from fedrisk.attacks.standard import (
    ALIE,
    ATTACK_CLASSES,
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
for _name, (_cls, _text) in ATTACK_CLASSES.items():
    ATTACKS.add(_name, _cls, _text)

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

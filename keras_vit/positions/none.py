"""`"none"`: no position embedding at all.

The patch tokens enter the encoder as they are (the paper's "no positional
information" baseline, Appendix D.4). Every default of `PositionKind` is
this kind: no role, no weights, nothing to resize or read from a file.
"""

from keras_vit.positions.base import PositionKind


class NoPositions(PositionKind):
    name = "none"


KIND = NoPositions()

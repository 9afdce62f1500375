"""Memory accounting: what autograd saves for backward, and human-readable byte sizes."""

from revnmt.memory.saved import SavedTensorMeter
from revnmt.memory.sizes import format_bytes, parse_bytes

__all__ = ["SavedTensorMeter", "format_bytes", "parse_bytes"]

"""JSON has no NaN or infinity: a response holding one cannot be written (DRF refuses, as the standard says), and
PostgreSQL's jsonb cannot store one. Numbers that come from outside (a run folder a trainer wrote, a tune's
measurements) are made finite before they are stored; what a view computes is checked before it is answered."""
import math


def non_finite_path(value, path: str = "") -> str | None:
    """The dotted path of the first NaN or infinity in a JSON value, or None when every number is finite."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path or "(the whole value)"
    if isinstance(value, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, item in items:
        found = non_finite_path(item, where)
        if found:
            return found
    return None


def finite(value):
    """``value`` with every NaN and infinity replaced by None (JSON null: "no number"), at any depth."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value

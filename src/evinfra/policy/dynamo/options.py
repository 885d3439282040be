"""Reading a bundle's options: typed getters that name the bad key or value in a ValueError.

Options arrive as `dict[str, object]` from a user's config file; every factory checks the
whole dict against the keys it knows, so a typo fails loudly instead of being ignored.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping


def check_known(options: Mapping[str, object], known: Collection[str], system: str) -> None:
    """Raise ValueError naming every key of `options` that `system` does not know."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"{system}: unknown option(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(known))}"
        )


def get_float(
    options: Mapping[str, object],
    key: str,
    default: float,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    min_exclusive: bool = False,
) -> float:
    raw = options.get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError(f"option {key!r} must be a number, got {raw!r}")
    value = float(raw)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"option {key!r} must be finite, got {raw!r}")
    if min_value is not None and (value < min_value or (min_exclusive and value == min_value)):
        bound = ">" if min_exclusive else ">="
        raise ValueError(f"option {key!r} must be {bound} {min_value}, got {raw!r}")
    if max_value is not None and value > max_value:
        raise ValueError(f"option {key!r} must be <= {max_value}, got {raw!r}")
    return value


def get_optional_float(
    options: Mapping[str, object], key: str, *, min_value: float = 0.0
) -> float | None:
    if options.get(key) is None:
        return None
    return get_float(options, key, 0.0, min_value=min_value)


def get_int(
    options: Mapping[str, object], key: str, default: int, *, min_value: int | None = None
) -> int:
    raw = options.get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"option {key!r} must be an integer, got {raw!r}")
    if min_value is not None and raw < min_value:
        raise ValueError(f"option {key!r} must be >= {min_value}, got {raw!r}")
    return raw


def get_bool(options: Mapping[str, object], key: str, default: bool) -> bool:
    raw = options.get(key, default)
    if not isinstance(raw, bool):
        raise ValueError(f"option {key!r} must be true or false, got {raw!r}")
    return raw


def get_choice(
    options: Mapping[str, object], key: str, default: str, choices: Collection[str]
) -> str:
    raw = options.get(key, default)
    if not isinstance(raw, str) or raw not in choices:
        raise ValueError(f"option {key!r} must be one of {sorted(choices)}, got {raw!r}")
    return raw

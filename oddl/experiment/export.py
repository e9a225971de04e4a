"""Writing index rows to a file: CSV with the stdlib always, Parquet through pandas and
pyarrow (the ``experiments`` extra)."""

from __future__ import annotations

import csv
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oddl.common.errors import ConfigError, MissingExtra

FORMATS = ("csv", "parquet")


def require_extra(package: str, feature: str) -> None:
    """MissingExtra naming the ``experiments`` extra when `package` is not installed."""
    if importlib.util.find_spec(package) is None:
        raise MissingExtra(f"{feature} needs {package}, which this host has not installed; "
                           "install the 'experiments' extra: pip install 'oddl[experiments]'")


def write_table(rows: Sequence[Mapping[str, Any]], path: Path, fmt: str | None = None) -> Path:
    """Write `rows` (dicts of one shape) to `path` as `fmt` (default: the suffix)."""
    fmt = fmt or path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ConfigError(f"{path}: no format {fmt!r}; name the file .csv or .parquet, or "
                          "pass --format csv|parquet")
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(rows[0]) if rows else []
    if fmt == "csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        return path
    require_extra("pandas", "exporting to Parquet")
    require_extra("pyarrow", "exporting to Parquet")
    import pandas as pd

    pd.DataFrame(list(rows), columns=columns).to_parquet(path, index=False)
    return path

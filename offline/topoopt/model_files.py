"""TopoOpt job models from TOML or JSON files (``oddl topoopt --model-file``).

A file names the model, its batch per node and its layer groups (`EXAMPLE`); every error is a
`ModelFileError` that names the file, the field and what a valid file looks like.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oddl.offline.topoopt.job_model import KINDS, JobModel, LayerGroup, TopoOptError
from oddl.offline.workloads import SUSTAINED_TFLOPS, compute_s


class ModelFileError(TopoOptError):
    """A model file is malformed: missing or mistyped fields, unknown keys."""


_GROUP_REQUIRED = ("name", "params", "in_elems", "out_elems")
_GROUP_OPTIONAL = ("compute_ms", "gmacs", "exchanges", "kind")
_TOP_REQUIRED = ("name", "batch", "groups")
_TOP_OPTIONAL = ("itemsize", "source", "sustained_tflops")

EXAMPLE = """\
name = "my-mlp"
batch = 64              # samples per node per iteration
itemsize = 4            # optional, bytes per element (4 = fp32)

[[groups]]
name = "fc1"
params = 4196352        # parameters
in_elems = 1024         # activation elements per sample entering the group
out_elems = 4096        # ... leaving it
compute_ms = 0.8        # forward + backward of one node's batch (or gmacs = per-sample MACs/1e9)
exchanges = 1           # optional: activation exchanges per pass when sharded
kind = "dense"          # optional: dense or embedding
"""


def load_model_file(path: str | Path) -> JobModel:
    """Read a model from a TOML or JSON file (by suffix); ModelFileError naming what is wrong."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {str(p)!r}: {exc.strerror or exc}") from None
    try:
        if p.suffix.lower() == ".json":
            doc = json.loads(raw)
        else:
            doc = tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        kind = "JSON" if p.suffix.lower() == ".json" else "TOML"
        raise ModelFileError(f"{p}: not valid {kind}: {exc}") from None
    return model_from_dict(doc, where=str(p))


def model_from_dict(doc: Any, where: str = "model") -> JobModel:
    """Build a model from a parsed model file; ModelFileError naming the missing fields."""
    if not isinstance(doc, Mapping):
        raise ModelFileError(f"{where}: the top level must be a table with {_TOP_REQUIRED}")
    _check_keys(doc, _TOP_REQUIRED, _TOP_OPTIONAL, where)
    name = _text(doc, "name", where)
    batch = _whole(doc, "batch", where, minimum=1)
    itemsize = _whole(doc, "itemsize", where, minimum=1) if "itemsize" in doc else 4
    tflops = _number(doc, "sustained_tflops", where, positive=True) \
        if "sustained_tflops" in doc else SUSTAINED_TFLOPS
    groups_doc = doc["groups"]
    if not isinstance(groups_doc, list) or not groups_doc:
        raise ModelFileError(f"{where}: groups must be a non-empty list of tables "
                             "([[groups]] in TOML)")
    groups: list[LayerGroup] = []
    for i, gd in enumerate(groups_doc):
        gw = f"{where}: groups[{i}]"
        if not isinstance(gd, Mapping):
            raise ModelFileError(f"{gw} must be a table")
        if isinstance(gd.get("name"), str):
            gw += f" ({gd['name']})"
        _check_keys(gd, _GROUP_REQUIRED, _GROUP_OPTIONAL, gw)
        if "compute_ms" not in gd and "gmacs" not in gd:
            raise ModelFileError(f"{gw}: missing field compute_ms (forward + backward of one "
                                 "node's batch, ms) or gmacs (forward MACs per sample / 1e9)")
        if "compute_ms" in gd:
            compute = _number(gd, "compute_ms", gw)
        else:
            compute = compute_s(batch, _number(gd, "gmacs", gw), tflops) * 1e3
        kind = gd.get("kind", "dense")
        if kind not in KINDS:
            raise ModelFileError(f"{gw}: kind must be one of {', '.join(KINDS)}; got {kind!r}")
        groups.append(LayerGroup(
            name=_text(gd, "name", gw), params=_whole(gd, "params", gw),
            in_elems=_whole(gd, "in_elems", gw), out_elems=_whole(gd, "out_elems", gw),
            compute_ms=compute,
            exchanges=_whole(gd, "exchanges", gw, minimum=1) if "exchanges" in gd else 1,
            kind=kind))
    names = [g.name for g in groups]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ModelFileError(f"{where}: group name(s) {', '.join(dup)} used twice; give every "
                             "group its own name")
    if not any(g.params for g in groups):
        raise ModelFileError(f"{where}: no group has parameters; give params > 0 somewhere")
    return JobModel(name, tuple(groups), batch, itemsize, str(doc.get("source", where)))


def _check_keys(doc: Mapping[str, Any], required: Sequence[str], optional: Sequence[str],
                where: str) -> None:
    missing = [k for k in required if k not in doc]
    if missing:
        raise ModelFileError(f"{where}: missing field(s) {', '.join(missing)}; a model file "
                             f"looks like:\n{EXAMPLE}")
    unknown = sorted(set(doc) - set(required) - set(optional))
    if unknown:
        raise ModelFileError(f"{where}: unknown field(s) {', '.join(unknown)}; known: "
                             f"{', '.join([*required, *optional])}")


def _text(doc: Mapping[str, Any], key: str, where: str) -> str:
    v = doc[key]
    if not isinstance(v, str) or not v.strip():
        raise ModelFileError(f"{where}: {key} must be a non-empty string; got {v!r}")
    return v.strip()


def _whole(doc: Mapping[str, Any], key: str, where: str, minimum: int = 0) -> int:
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ModelFileError(f"{where}: {key} must be a whole number >= {minimum}; got {v!r}")
    return v


def _number(doc: Mapping[str, Any], key: str, where: str, positive: bool = False) -> float:
    v = doc[key]
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) \
        and (v > 0 if positive else v >= 0)
    if not ok:
        raise ModelFileError(f"{where}: {key} must be a number {'> 0' if positive else '>= 0'};"
                             f" got {v!r}")
    return float(v)

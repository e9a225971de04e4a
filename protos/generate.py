"""Generate the Python gRPC code for protos/oddl.proto (`make protos`).

The .proto is compiled as `oddl/protos/oddl.proto` inside a temporary tree so that the
generated modules import each other as `oddl.protos.…`, then copied next to the source.
With `--check`, nothing is written: exit 1 when the committed code differs (stale).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUTPUTS = ("oddl_pb2.py", "oddl_pb2.pyi", "oddl_pb2_grpc.py")


def generate(dest: Path) -> None:
    """Compile oddl.proto into `dest` (a directory)."""
    from grpc_tools import protoc  # dev dependency; imported here so the runtime never needs it

    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "oddl" / "protos"
        tree.mkdir(parents=True)
        shutil.copy(HERE / "oddl.proto", tree / "oddl.proto")
        args = ["protoc", f"-I{tmp}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}", "oddl/protos/oddl.proto"]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed on protos/oddl.proto")
        for name in OUTPUTS:
            shutil.copy(tree / name, dest / name)


def main(argv: list[str] | None = None) -> int:
    """Regenerate, or with --check report whether the committed code is stale."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    if not args.check:
        generate(HERE)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [n for n in OUTPUTS
                 if (Path(tmp) / n).read_bytes() != (HERE / n).read_bytes()]
    if stale:
        print(f"stale generated code: {', '.join(stale)}; run `make protos`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

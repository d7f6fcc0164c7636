"""Regenerate the Python code for every proto under protos/ into libs/api/.

    python -m dispo.libs.protogen            # rewrite libs/api
    python -m dispo.libs.protogen --check    # exit 1 if libs/api differs from a fresh run

protoc writes modules named after the proto path (``dispo/gateway/v1/gateway_pb2.py``
importing ``dispo.common.v1``); they are placed under ``dispo.libs.api`` and their
imports rewritten to match, so every service imports one copy of the contracts.

Beside them it writes ``descriptors.binpb``: every proto and what it imports as one
``FileDescriptorSet`` *with* the protos' comments (``--include_source_info``), which the
generated modules leave out. Server reflection serves it (:mod:`dispo.libs.reflection`), so
``grpcurl describe`` shows what each element means.
"""

from __future__ import annotations

import argparse
import fcntl
import filecmp
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "protos"
API_DIR = REPO_ROOT / "libs" / "api"
_IMPORT = re.compile(r"^(from|import) dispo\.(?!libs\.)", re.MULTILINE)
_BIN = Path(sys.executable).parent
DESCRIPTOR_SET = "descriptors.binpb"
_API_INIT = '"""Generated from protos/ by `python -m dispo.libs.protogen`. Do not edit."""\n'


def generate(out_dir: Path) -> None:
    """Run protoc on every proto file and lay the result out as the dispo.libs.api package."""
    from grpc_tools import protoc  # dev dependency, imported only when generating

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as raw:
        include = str(Path(protoc.__file__).parent / "_proto")
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--plugin=protoc-gen-mypy={_BIN / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={_BIN / 'protoc-gen-mypy_grpc'}",
            f"--python_out={raw}",
            f"--grpc_python_out={raw}",
            f"--mypy_out={raw}",
            f"--mypy_grpc_out={raw}",
            "--include_imports",
            "--include_source_info",
            f"--descriptor_set_out={Path(raw) / DESCRIPTOR_SET}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        generated = Path(raw) / "dispo"
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "__init__.py").write_text(_API_INIT)
        (out_dir / DESCRIPTOR_SET).write_bytes(_as_generated(Path(raw) / DESCRIPTOR_SET))
        for path in sorted(generated.rglob("*")):
            target = out_dir / path.relative_to(generated)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                (target / "__init__.py").write_text("")
                continue
            text = _IMPORT.sub(r"\1 dispo.libs.api.", path.read_text())
            target.write_text(text)


def _as_generated(path: Path) -> bytes:
    """The descriptor set at ``path`` without the ``json_name`` protoc adds to every field.
    The generated modules leave it out, and with it reflection clients (grpcurl) would print
    camelCase names (``taskId``) instead of the proto names every example shows."""
    from google.protobuf import descriptor_pb2

    def strip(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
        for message in messages:
            for field in message.field:
                field.ClearField("json_name")
            strip(message.nested_type)

    files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())
    for file in files.file:
        strip(file.message_type)
    return files.SerializeToString(deterministic=True)


def _same_tree(a: Path, b: Path) -> list[str]:
    """Paths (under ``a``) present in only one tree or with different contents."""
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    diffs = [str(a / d) for d in (*cmp.left_only, *cmp.right_only)]
    diffs += [str(a / f) for f in cmp.common_files if (a / f).read_bytes() != (b / f).read_bytes()]
    for sub in cmp.common_dirs:
        diffs += _same_tree(a / sub, b / sub)
    return diffs


def check(api_dir: Path = API_DIR) -> list[str]:
    """Files under ``api_dir`` that differ from a fresh generation (empty when in sync)."""
    with tempfile.TemporaryDirectory() as fresh:
        generate(Path(fresh))
        if not api_dir.exists():
            return [str(api_dir)]
        filecmp.clear_cache()
        return [d.replace(str(api_dir), "libs/api") for d in _same_tree(api_dir, Path(fresh))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if libs/api is stale")
    options = parser.parse_args()
    if options.check:
        stale = check()
        if stale:
            print("libs/api differs from protos/:", *stale, sep="\n  ")
            sys.exit(1)
        print("libs/api is up to date")
        return
    with open(REPO_ROOT / ".protogen.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with tempfile.TemporaryDirectory() as fresh:
            generate(Path(fresh) / "api")
            shutil.rmtree(API_DIR, ignore_errors=True)
            shutil.copytree(Path(fresh) / "api", API_DIR)
    print(f"generated {API_DIR.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()

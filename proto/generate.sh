#!/usr/bin/env sh
# Regenerates the committed Python modules for proto/api.proto, cluster.proto and batches.proto:
#   src/liftlog/api/_gen/{api,cluster,batches}_pb2.py, _pb2.pyi, _pb2_grpc.py
#
# Usage (from anywhere):  proto/generate.sh
# Uses $PYTHON, or .venv/bin/python of the repository, which needs the dev
# extra installed (pip install -e '.[dev]') for grpcio-tools.
#
# The grpcio-tools release decides which grpcio and protobuf versions the
# generated code needs at runtime (pyproject.toml pins them to match), so this
# script refuses any release other than EXPECTED_GRPCIO_TOOLS. Changing it means
# changing the runtime pins in pyproject.toml too.
set -eu

EXPECTED_GRPCIO_TOOLS=1.85.1

root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
out=$root/src/liftlog/api/_gen

version=$("$python" -c 'from importlib.metadata import version; print(version("grpcio-tools"))' 2>/dev/null) || {
    echo "generate.sh: grpcio-tools is not installed for $python (pip install -e '.[dev]')" >&2
    exit 1
}
if [ "$version" != "$EXPECTED_GRPCIO_TOOLS" ]; then
    echo "generate.sh: grpcio-tools $version found, $EXPECTED_GRPCIO_TOOLS expected (see the comment at the top)" >&2
    exit 1
fi

mkdir -p "$out"
"$python" -m grpc_tools.protoc \
    -I"$root/proto" \
    --python_out="$out" \
    --pyi_out="$out" \
    --grpc_python_out="$out" \
    "$root/proto/api.proto" "$root/proto/cluster.proto" "$root/proto/batches.proto"

# protoc writes top-level imports (`import api_pb2 as api__pb2`); inside the
# package they must be relative.
for name in api cluster batches; do
    grpc_py=$out/${name}_pb2_grpc.py
    sed "s/^import ${name}_pb2 as ${name}__pb2\$/from . import ${name}_pb2 as ${name}__pb2/" "$grpc_py" >"$grpc_py.tmp"
    mv "$grpc_py.tmp" "$grpc_py"
    grep -q "^from \\. import ${name}_pb2 as ${name}__pb2\$" "$grpc_py" || {
        echo "generate.sh: could not rewrite the ${name}_pb2 import in ${name}_pb2_grpc.py" >&2
        exit 1
    }
done

[ -f "$out/__init__.py" ] || printf '"""Code generated from proto/api.proto by proto/generate.sh. Do not edit."""\n' >"$out/__init__.py"
echo "generated {api,cluster,batches}_pb2.py, _pb2.pyi, _pb2_grpc.py in $out with grpcio-tools $version"

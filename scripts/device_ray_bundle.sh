#!/usr/bin/env bash
# Run where a package registry is reachable: builds .raybundle/ray-py312.tar.xz, a site folder holding Ray
# (the version installed here) and what a local Ray Serve needs at import and run time that a machine without a registry
# (Python 3.12, x86-64, no registry) lacks. `source scripts/device_setup.sh` there unpacks it into /tmp/site.
#   bash scripts/device_ray_bundle.sh        # then copy .whl/ and .raybundle/ with the checkout
# Packages such a machine has (aiohttp, grpcio, protobuf, numpy, ...) and those brought in .whl/ (starlette,
# uvicorn, websockets) are left out. Left out as well: what a local Ray with Serve never loads with the
# dashboard off: the Java jar, the dashboard's web client, RLlib, the HAProxy binary, py-spy, console scripts.
set -euo pipefail
cd "$(dirname "$0")/.."

# name, one a line; each pinned to the version installed here when it is installed here.
PACKAGES="
ray
jsonschema jsonschema-specifications referencing rpds-py
pydantic pydantic-core annotated-types typing-inspection
fastapi annotated-doc
aiohttp-cors colorful
opencensus opencensus-context google-api-core google-auth googleapis-common-protos proto-plus pyasn1 pyasn1-modules
opentelemetry-api opentelemetry-sdk opentelemetry-proto opentelemetry-exporter-prometheus opentelemetry-semantic-conventions
grpcio-reflection mmh3
smart-open wrapt
virtualenv distlib platformdirs python-discovery
watchfiles httptools python-dotenv
"
# Left out of the unpacked Ray: paths relative to the site folder.
STRIP="
bin
ray/jars
ray/dashboard/client/build
ray/rllib
"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
requirements=()
for name in $PACKAGES; do
  version=$(python3 -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$name")
  requirements+=("$name${version:+==$version}")
done
echo "bundle: ${requirements[*]}"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --abi abi3 --abi none "${platforms[@]}" --platform any -d "$work/wheels" "${requirements[@]}"
python3 -m pip install -q --no-deps --no-index --no-compile --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none "${platforms[@]}" --platform any \
  --target "$work/site" "$work"/wheels/*.whl

for path in $STRIP; do rm -rf "${work:?}/site/$path"; done
find "$work/site" -depth \( -name __pycache__ -o -name '*.js.map' \) -exec rm -rf {} +
find "$work/site/ray" -depth -type d -name examples -exec rm -rf {} +  # Tune's and Train's sample scripts

mkdir -p .raybundle
tar -C "$work/site" -cf - . | xz -9 -T0 > .raybundle/ray-py312.tar.xz
du -sh "$work/site" | sed 's/\t.*/ unpacked/'
ls -l .raybundle/ray-py312.tar.xz | awk '{printf "%s: %.1f MiB\n", $NF, $5 / 1048576}'

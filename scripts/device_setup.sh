#!/usr/bin/env bash
# Source this on the GPU machine (no registry there): installs the carried wheels (.whl/) into
# /tmp/site and makes `duplexcadence` importable from this checkout without building it.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/duplexcadence
export PYTHONPATH=/tmp/pkgs:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1

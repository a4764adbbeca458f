#!/usr/bin/env bash
# The package as a user installs it: `pip install ".[serve]"` (not editable) of this checkout's files into a fresh
# venv, then, from a folder outside the checkout, the README's quickstart, `dsl bench toy` on the CPU, and
# `dsl serve toy` on loopback driven by `dsl loadgen --verify`. A module or data file the wheel leaves out fails it.
# The venv gets the torch this interpreter has (its exact version, so pip takes that build and never resolves
# another), then the package and its requirements from the registry. About 2 minutes on 2 cores.
#   bash scripts/check_install.sh
# PYTHON selects the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PYTHON:-python3}
work=$(mktemp -d)
server=""
cleanup() {
    if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then
        kill "$server"
        wait "$server" || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
say() { echo "check_install.sh: $* (${SECONDS} s)"; }
fail() {
    echo "check_install.sh: $*" >&2
    exit 1
}

# The checkout's files (tracked, and new ones not ignored): no build/ or egg-info of an earlier build.
mkdir -p "$work/src" "$work/elsewhere"
git ls-files -z --cached --others --exclude-standard | tar --null -T - --ignore-failed-read -cf - | tar -xf - -C "$work/src"

torch_version=$("$PY" -c "import torch; print(torch.__version__)")
"$PY" -m venv "$work/venv"
venv_python="$work/venv/bin/python"
pip_install() {  # pip's output shown only when it fails
    "$venv_python" -m pip install --disable-pip-version-check "$@" >"$work/pip.log" 2>&1 || {
        cat "$work/pip.log" >&2
        fail "pip install $* failed"
    }
}
pip_install "torch==$torch_version"
pip_install "$work/src[serve]"
say "installed duplexcadence $("$venv_python" -c 'import importlib.metadata as m; print(m.version("duplexcadence"))')" \
    "(not editable) with the serve extra, and torch $torch_version, into a fresh venv"

cd "$work/elsewhere"
unset PYTHONPATH
"$venv_python" - "$work/venv" <<'PY'
import sys
from pathlib import Path

import duplexcadence

where = Path(duplexcadence.__file__).resolve()
assert where.is_relative_to(Path(sys.argv[1]).resolve()), f"duplexcadence was imported from {where}, not the venv"
PY

"$venv_python" - "$root/README.md" >quickstart.py <<'PY'
import re
import sys

text = open(sys.argv[1], encoding="utf-8").read()
section = text[text.index("## Quickstart") :]
print(re.search(r"```python\n(.*?)```", section, re.S).group(1))
PY
"$venv_python" quickstart.py || fail "the README's quickstart failed"
say "the README's quickstart ran"

"$work/venv/bin/dsl" bench toy --device cpu --seconds 2 --no-progress >bench.txt || {
    cat bench.txt
    fail "dsl bench toy failed"
}
say "dsl bench toy ran, bit-identical"

# A given tick model: admission does not depend on how busy the machine is while it calibrates.
"$work/venv/bin/dsl" serve toy --device cpu --port 0 --slots 2 --lanes 2 --tick-model 1+1 --log-level warning \
    2>serve.log &
server=$!
url=""
for _ in $(seq 600); do
    url=$(grep -o 'ws://[^ ]*/v1/session' serve.log | head -n 1 || true)
    [ -n "$url" ] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.2
done
if [ -z "$url" ]; then
    cat serve.log >&2
    fail "dsl serve toy did not say where it serves"
fi
"$work/venv/bin/dsl" loadgen "$url" --sessions 2 --ticks 10 --verify || {
    cat serve.log >&2
    fail "dsl loadgen --verify against dsl serve toy failed"
}
kill -TERM "$server"
stopped=0
wait "$server" || stopped=$?
[ "$stopped" = 0 ] || [ "$stopped" = 143 ] || fail "dsl serve toy exited $stopped on SIGTERM (its log: $(cat serve.log))"
server=""
say "dsl serve toy served $url, and dsl loadgen --verify found every output equal to stock"

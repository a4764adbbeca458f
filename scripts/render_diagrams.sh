#!/usr/bin/env bash
# Redraw docs/diagrams/: every stdlib model tail in every view `dsl render --list-views` lists, the
# tutorial's timeline, and the package's layers (docs/architecture.md), as SVG (needs Graphviz's dot).
#   bash scripts/render_diagrams.sh            # SVG, committed
#   FORMAT=png bash scripts/render_diagrams.sh # PNG beside them, to look at (not committed)
set -euo pipefail
cd "$(dirname "$0")/.."
FORMAT=${FORMAT:-svg}
mkdir -p docs/diagrams
views=$(dsl render --list-views | cut -d' ' -f1)
for model in stdlib/models/*.clock; do
    name=$(basename "$model" .clock)
    for view in $views; do
        dsl render "$model" --view "$view" -o "docs/diagrams/$name-$view.$FORMAT"
    done
done

# docs/tutorial.md's model: its files as the reader writes them, rendered where the reader renders them;
# tests/docs/test_tutorial.py compares the tutorial's DOT with the golden copy written here.
tutorial=$(mktemp -d)
trap 'rm -rf "$tutorial"' EXIT
"${PYTHON:-python3}" tests/docs/test_tutorial.py "$tutorial"
(cd "$tutorial" && dsl render tinyvoc.clock -o "tinyvoc-timeline.$FORMAT" && dsl render tinyvoc.clock -o tinyvoc-timeline.dot)
cp "$tutorial/tinyvoc-timeline.$FORMAT" docs/diagrams/
cp "$tutorial/tinyvoc-timeline.dot" tests/docs/golden/

# docs/architecture.md's picture: the layer table of tests/architecture/test_layers.py and the imports between layers
"${PYTHON:-python3}" tests/architecture/test_layers.py "docs/diagrams/layers.$FORMAT"

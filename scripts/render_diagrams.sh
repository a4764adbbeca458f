#!/usr/bin/env bash
# Redraw docs/diagrams/: every stdlib model tail in every `dsl render` view, as SVG (needs Graphviz's dot).
#   bash scripts/render_diagrams.sh            # SVG, committed
#   FORMAT=png bash scripts/render_diagrams.sh # PNG beside them, to look at (not committed)
set -euo pipefail
cd "$(dirname "$0")/.."
FORMAT=${FORMAT:-svg}
mkdir -p docs/diagrams
for model in stdlib/models/*.clock; do
    name=$(basename "$model" .clock)
    for view in timeline graph arena; do
        dsl render "$model" --view "$view" -o "docs/diagrams/$name-$view.$FORMAT"
    done
done

"""The results tables of README.md and docs/benchmarks.md, printed from docs/benchmarks/*.json.

    python scripts/results_table.py            # print every table
    python scripts/results_table.py --write    # rewrite the tables in README.md and docs/benchmarks.md
    python scripts/results_table.py --check    # exit 1, naming the tables the docs have out of date

A table sits in a page between `<!-- results_table.py: NAME -->` and `<!-- end results_table.py -->`;
tests/docs/test_results_table.py fails when one differs from what this script prints. After a GPU run
(`dsl bench TAIL --output-format json`, added with scripts/bench_summary.py), `--write` updates the docs.

Which runs the tables show, per tail (a `*.json` holds a list of runs, oldest first):

* a run's *configuration* is its description up to the first `;` (dtype, batch, steps);
* a run *enters* when every timed variant has its per-second series (`per_second_ms`, so that the
  warm-up and the steady state can be checked) and it timed the tail's full set of variants (its
  command has no `--variants`);
* per configuration the latest run that enters is the *current* one; older runs are not shown;
* a row pairs the run's stock variant (the shipped streaming path) with one DuplexCadence variant; with
  `--interleave` the row gives the interleaved pass (every variant built before any is timed), else
  the sequential one;
* a row is *settled* when, for both of its variants, the median of the last half of the steady seconds
  is within `SETTLED` of the median of all of them; a row that is not is left out of the tables and
  named below them with its command.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks"
PAGES = (ROOT / "README.md", ROOT / "docs" / "benchmarks.md")

SETTLED = 0.25
"""How far (a fraction of the median) the last half of a variant's steady seconds may sit from the median
of all of them for a row to count as settled."""

BEGIN = re.compile(r"^<!-- results_table\.py: (?P<name>[\w-]+) -->$")
END = "<!-- end results_table.py -->"


@dataclass(frozen=True)
class Tail:
    key: str  # the JSON's file stem and `dsl bench` name
    title: str  # how the tables name it
    runs_key: str | None = None  # where the file keeps its runs, when not at the top


TAILS = (
    Tail("moshi", "Moshi, Mimi decoder"),
    Tail("personaplex", "PersonaPlex, 2 × Mimi decoder"),
    Tail("minicpmo45", "MiniCPM-o 4.5, token2wav", runs_key="bench"),
    Tail("qwen3omni", "Qwen3-Omni, Code2Wav"),
)


@dataclass(frozen=True)
class Row:
    tail: Tail
    run: dict
    config: str
    stock: dict
    cadence: dict
    interleaved: bool

    def ms(self, variant: dict) -> float:
        return passes_median(variant, self.interleaved)

    @property
    def ratio(self) -> float:
        return self.ms(self.stock) / self.ms(self.cadence)

    @property
    def settled(self) -> bool:
        return settled(self.stock) and settled(self.cadence)


# --- reading the runs --------------------------------------------------------------------------------


def load(tail: Tail, json_dir: Path = DOCS) -> list[dict]:
    """The tail's runs, oldest first; a run summarised once per DuplexCadence variant is kept once."""
    path = json_dir / f"{tail.key}.json"
    if not path.exists():
        return []
    document = json.loads(path.read_text())
    runs = document[tail.runs_key] if tail.runs_key else document
    if isinstance(runs, dict):
        runs = [runs]
    unique: list[dict] = []
    for run in runs:
        if unique and unique[-1].get("variants") and unique[-1].get("variants") == run.get("variants"):
            continue
        unique.append(run)
    return unique


def configuration(run: dict) -> str:
    return run["description"].split(";")[0].strip()


def enters(run: dict) -> bool:
    variants = run.get("variants") or []
    timed = [v for v in variants if v.get("ms_per_s_median") is not None]
    return bool(timed) and all(v.get("per_second_ms") for v in timed) and "--variants" not in run.get("command", "")


def current_runs(runs: list[dict]) -> list[dict]:
    """Per configuration, the latest run that enters; in the order the configurations first appear."""
    latest: dict[str, dict] = {}
    for run in runs:
        if enters(run):
            latest[configuration(run)] = run
    return list(latest.values())


def passes_median(variant: dict, interleaved: bool) -> float:
    if interleaved:
        return variant["info"]["interleaved"]["ms_per_s_median"]
    return variant["ms_per_s_median"]


def is_interleaved(run: dict) -> bool:
    timed = [v for v in run["variants"] if v.get("ms_per_s_median") is not None]
    return all("ms_per_s_median" in (v.get("info") or {}).get("interleaved", {}) for v in timed)


def steady_seconds(variant: dict) -> list[float]:
    return list(variant.get("per_second_ms") or [])[variant.get("warmup_seconds") or 0 :]


def settled(variant: dict) -> bool:
    steady = steady_seconds(variant)
    if len(steady) < 2:
        return True
    whole = statistics.median(steady)
    return abs(statistics.median(steady[len(steady) // 2 :]) - whole) <= SETTLED * whole


def stock_variant(run: dict) -> dict:
    """The shipped streaming path: the run's `stock_variant` when it names one of its variants, else the
    reference (stock eager, timed first)."""
    by_name = {v["name"]: v for v in run["variants"]}
    return by_name.get(run.get("stock_variant", ""), run["variants"][0])


def cadence_variants(run: dict) -> list[dict]:
    return [v for v in run["variants"] if v["name"].startswith("duplexcadence") and v.get("ms_per_s_median")]


def short_config(run: dict, variant: dict) -> str:
    """`fp32, B=1` from the description (dtype, batch, steps, prompt), with the variant's own qualifier
    (`2 lanes`) and the pass."""
    words = []
    for part in re.sub(r"\([^)]*\)", "", configuration(run)).split(","):
        part = part.strip()
        if part in ("fp32", "bf16", "fp16") or re.fullmatch(r"(B|P)=\d+", part):
            words.append(part)
        elif match := re.fullmatch(r"n_timesteps=(\d+)", part):
            words.append(f"n={match.group(1)}")
        elif part in ("eager rope", "compiled rope"):  # moshi's rope, compiled by default (NO_TORCH_COMPILE=1: eager)
            words.append(part)
    qualifier = variant["name"].partition(",")[2].strip()
    if qualifier:
        words.append(qualifier)
    return ", ".join(words)


def rows(tail: Tail, json_dir: Path = DOCS) -> list[Row]:
    """Every row of the tail's current runs, settled or not."""
    found = []
    for run in current_runs(load(tail, json_dir)):
        interleaved = is_interleaved(run)
        for cadence in cadence_variants(run):
            config = short_config(run, cadence) + (" (interleaved pass)" if interleaved else "")
            found.append(Row(tail, run, config, stock_variant(run), cadence, interleaved))
    return found


# --- formatting ----------------------------------------------------------------------------------------


def size(count: int | None) -> str:
    if count is None:
        return "-"
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def memory_change(before: int | None, after: int | None) -> str:
    first, second = size(before), size(after)
    if first.endswith(" MiB") and second.endswith(" MiB"):
        return f"{first.removesuffix(' MiB')} → {second}"
    return f"{first} → {second}"


def short_error(text: str | None) -> str:
    """An exception's first line (and the cause it names, when the first line ends with a colon), without
    its stack trace or object addresses, for a table cell."""
    lines = [line.strip() for line in (text or "no result").splitlines() if line.strip()]
    first = lines[0] + (f" {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else "")
    first = re.sub(r" at 0x[0-9a-f]+", "", first.split(" Stack trace:")[0])
    return (first[:197] + "...") if len(first) > 200 else first


def yes_no(value: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "not compared"}[value]


def command(run: dict) -> str:
    return run["command"]


def environment(run: dict) -> str:
    parts = [run.get("device") or run.get("gpu") or "?"]
    if run.get("driver"):
        parts.append(f"driver {run['driver']}")
    parts.append(f"torch {run['torch']}")
    if run.get("cuda"):
        parts.append(f"CUDA {run['cuda']}")
    return ", ".join(parts)


def table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(cells) + " |" for cells in body]


def summary_cells(row: Row, with_tail: bool) -> list[str]:
    cells = [row.tail.title] if with_tail else []
    return cells + [
        row.config,
        f"{row.ms(row.stock):.1f}",
        f"**{row.ms(row.cadence):.1f}**",
        f"**{row.ratio:.2f}x**",
        memory_change(row.stock.get("peak_allocated_bytes"), row.cadence.get("peak_allocated_bytes")),
        yes_no(row.cadence.get("bit_identical")),
    ]


SUMMARY_HEADER = [
    "config",
    "stock (shipped path), ms/s",
    "DuplexCadence, ms/s",
    "speed-up",
    "peak memory, stock → DuplexCadence",
    "bit-identical",
]


def unsettled_line(unsettled: list[Row]) -> list[str]:
    """One line naming the runs whose rows are left out, with the steady seconds that moved."""
    named: dict[int, str] = {}
    for row in unsettled:
        if id(row.run) in named:
            continue
        moved = [v for v in row.run["variants"] if v in (row.stock, *cadence_variants(row.run)) and not settled(v)]
        seconds = "; ".join(f"{v['name']} " + ", ".join(f"{s:.0f}" for s in steady_seconds(v)) for v in moved)
        config = short_config(row.run, {"name": ""})
        named[id(row.run)] = f"{config} (`{command(row.run)}`: steady seconds of {seconds} ms)"
    if not named:
        return []
    return ["", "Left out, not settled in their run: " + "; ".join(named.values()) + "."]


def readme_block(json_dir: Path = DOCS) -> list[str]:
    """README's results table: every settled row of every tail, the commands under it."""
    shown: list[Row] = []
    unsettled: list[Row] = []
    for tail in TAILS:
        for row in rows(tail, json_dir):
            if not headline(row):
                continue
            if row.settled:
                shown.append(row)
            else:
                unsettled.append(row)
    body = [summary_cells(row, with_tail=True) for row in shown]
    commands = dict.fromkeys(f"`{command(row.run)}`" for row in shown)
    environments = dict.fromkeys(environment(row.run) for row in shown)
    lines = table(["tail", *SUMMARY_HEADER], body)
    notes = [note for row in shown for note in unshipped_notes(row)]
    lines += [""] + notes + ([""] if notes else [])
    lines += ["Commands: " + ", ".join(commands) + ".", f"Environment: {'; '.join(environments)}."]
    return lines


UNSHIPPED = {
    "moshi whole-step graph": "one `CUDAGraphed` around moshi's whole decode step, which moshi does not ship",
}
"""Variants that are not a stock path but bound what graphs alone can give; README names each beside its row."""


def unshipped_notes(row: Row) -> list[str]:
    """A line per variant of `row`'s run in UNSHIPPED: its time in the row's pass, against the row's stock and
    DuplexCadence, so that the row's speed-up is read against the right baseline."""
    notes = []
    for variant in row.run["variants"]:
        if variant["name"] in UNSHIPPED and variant.get("ms_per_s_median") is not None:
            bound = passes_median(variant, row.interleaved)
            notes.append(
                f"{row.tail.title}: the speed-up is against moshi's shipped path, which graphs module by module. "
                f"`{variant['name']}` ({UNSHIPPED[variant['name']]}) runs at {bound:.1f} ms/s in the same pass, "
                f"level with DuplexCadence's {row.ms(row.cadence):.1f}: {row.ms(row.stock) / bound:.2f}x over the "
                "shipped path."
            )
    return notes


def headline(row: Row) -> bool:
    """README's rows: the default DuplexCadence variant and the one its run's summary names (`2 lanes`)."""
    return row.cadence["name"] in ("duplexcadence", row.run.get("cadence_variant"))


def variant_cells(run: dict, variant: dict, interleaved: bool) -> list[str]:
    if variant.get("ms_per_s_median") is None:
        return [variant["name"], "failed", "-", "-", "-", "-", short_error(variant.get("error"))]
    if variant is run["variants"][0]:
        identical = "reference"
    elif variant.get("bit_identical") is not None:
        identical = yes_no(variant["bit_identical"])
        if variant["bit_identical"] is False and variant.get("first_mismatch"):
            identical += f" ({variant['first_mismatch'].split(', first differing')[0]})"
    elif "max_abs_diff_vs_reference" in (variant.get("info") or {}):
        identical = f"no, by design (max abs {variant['info']['max_abs_diff_vs_reference']:.2f})"
    else:
        identical = "- (another op set)"
    busy = variant.get("gpu_busy_ms_per_s")
    return [
        variant["name"],
        f"{variant['ms_per_s_median']:.1f}",
        f"{variant['ms_per_s_p99']:.1f}",
        f"{passes_median(variant, True):.1f}" if interleaved else "-",
        f"{busy:.1f}" if busy else "-",
        size(variant.get("peak_allocated_bytes")),
        identical,
    ]


VARIANT_HEADER = [
    "variant",
    "ms/s, median",
    "p99",
    "interleaved, median",
    "GPU busy, ms/s",
    "peak allocated",
    "bit-identical to stock eager",
]


def tail_block(tail: Tail, json_dir: Path = DOCS) -> list[str]:
    """A tail's section of docs/benchmarks.md: its settled rows, then every variant of each current run
    with its command and environment."""
    tail_rows = rows(tail, json_dir)
    settled_rows = [r for r in tail_rows if r.settled]
    if not settled_rows:
        lines = ["No settled run of this tail is in `docs/benchmarks/" + tail.key + ".json`."]
        return lines + unsettled_line([r for r in tail_rows if not r.settled])
    lines = table(SUMMARY_HEADER, [summary_cells(r, with_tail=False) for r in settled_rows])
    lines += unsettled_line([r for r in tail_rows if not r.settled])
    shown = list({id(r.run): r.run for r in settled_rows}.values())
    for run in shown:
        interleaved = is_interleaved(run)
        lines += [
            "",
            f"`{command(run)}`: {configuration(run)}; stock (shipped path) `{stock_variant(run)['name']}`; "
            f"{environment(run)}.",
            "",
        ]
        lines += table(VARIANT_HEADER, [variant_cells(run, v, interleaved) for v in run["variants"]])
    return lines


# --- sessions per GPU --------------------------------------------------------------------------------


def density_block(json_dir: Path = DOCS) -> list[str]:
    """Sessions per GPU at the 1 s cadence (p99 round under 1 s), stock against DuplexCadence, from
    `mimi_lockstep_density.json` and the MiniCPM-o sweeps of `minicpmo45.json`."""
    body: list[list[str]] = []
    commands: list[str] = []
    environments: list[str] = []
    mimi_path = json_dir / "mimi_lockstep_density.json"
    if mimi_path.exists():
        mimi = json.loads(mimi_path.read_text())
        kinds = {r["kind"]: r for r in mimi["results"]}
        in_turn, ours = kinds["moshi stock, in turn"], kinds["duplexcadence, in turn"]
        batched, lockstep = kinds["moshi stock, batched B=32"], kinds["duplexcadence, lockstep B=32"]
        body.append(
            density_row(
                "Moshi, Mimi decoder",
                "in turn, batch-1 sessions",
                in_turn,
                ours,
                compared(ours, "moshi stock, in turn"),
            )
        )
        body.append(
            density_row(
                "Moshi, Mimi decoder",
                "batched B=32: moshi's batched streaming; lockstep groups (opt-in)",
                batched,
                lockstep,
                compared(lockstep, "moshi stock, batched B=32") + " against moshi's batched decode",
            )
        )
        commands.append(mimi_command(mimi))
        environments.append(environment({**mimi, "device": mimi.get("gpu")}))
    minicpm_path = json_dir / "minicpmo45.json"
    if minicpm_path.exists():
        for how, run, ours in minicpm_sweeps(json.loads(minicpm_path.read_text()).get("sessions", [])):
            sweep = run["sessions_in_turn"]
            compared_with = ours.get("chunks_compared_with_stock", sweep["chunks_compared"])
            differ = ours.get("chunks_not_equal_to_stock", sweep["chunks_not_equal"])
            body.append(
                density_row(
                    "MiniCPM-o 4.5, token2wav", how, sweep["stock"], ours, f"{compared_with} chunks, {differ} differ"
                )
            )
            commands.append(run["command"])
            environments.append(environment({**run, "device": run.get("gpu")}))
    header = ["tail", "sessions served", "stock", "DuplexCadence", "ratio", "outputs compared with stock"]
    lines = table(header, body)
    return lines + [
        "",
        "Commands: " + ", ".join(f"`{c}`" for c in dict.fromkeys(commands)) + ".",
        f"Environment: {'; '.join(dict.fromkeys(environments))}.",
    ]


def minicpm_sweeps(runs: list[dict]) -> list[tuple[str, dict, dict]]:
    """(how the sessions are served, the run, its DuplexCadence sweep): per way of serving (in turn, K
    lanes), the latest run that has it, each against the stock sweep of its own run."""
    latest: dict[str, tuple[dict, dict]] = {}
    for run in runs:
        sweep = run["sessions_in_turn"]
        if "duplexcadence" in sweep:
            latest["in turn, one slot each"] = (run, sweep["duplexcadence"])
        for lanes, ours in sweep.get("duplexcadence_lanes", {}).items():
            latest[f"in turn, {lanes} lanes"] = (run, ours)
    return [(how, run, ours) for how, (run, ours) in latest.items()]


REACHED = 0.95
"""A sweep has reached its limit when a count over the 1 s cadence was swept, or when its largest count's p99
round is within 5 % of the cadence; else its largest passing count is a lower bound, shown `≥ N`."""


def limit_reached(result: dict) -> bool:
    """Whether `result`'s sweep found its limit (a sweep not recorded counts as found)."""
    sweep = result.get("sweep")
    if not sweep:
        return True
    best = result["max_sessions_p99_under_1s"]
    over = [p for p in sweep if p["sessions"] > best]
    at_best = [p["round_ms_p99"] for p in sweep if p["sessions"] == best]
    return bool(over) or (bool(at_best) and at_best[0] >= REACHED * 1000)


def limit_text(result: dict) -> str:
    """The sessions `result` held at the cadence: `N`, or `≥ N` where the sweep stopped short of the limit."""
    best = result["max_sessions_p99_under_1s"]
    return str(best) if limit_reached(result) else f"≥ {best}"


def density_row(tail: str, how: str, stock: dict, ours: dict, compared_text: str) -> list[str]:
    theirs, mine = stock["max_sessions_p99_under_1s"], ours["max_sessions_p99_under_1s"]
    ratio = f"{mine / theirs:.2f}x"
    if not limit_reached(stock):
        ratio = "-"  # stock's limit is not known
    elif not limit_reached(ours):
        ratio = f"≥ {ratio}"
    return [tail, how, limit_text(stock), f"**{limit_text(ours)}**", ratio, compared_text]


def compared(result: dict, against: str) -> str:
    count = result[f"frames_compared_with_{against}"]
    differ = result[f"frames_not_equal_to_{against}"]
    return f"{thousands(count)} frames, {differ} differ"


def thousands(count: int) -> str:
    return f"{count:,}".replace(",", " ")


def mimi_command(mimi: dict) -> str:
    counts = {r["kind"]: ",".join(str(p["sessions"]) for p in r["sweep"]) for r in mimi["results"]}
    return (
        f"python scripts/lockstep_density.py --rows {mimi['rows']} --in-turn-sessions {counts['moshi stock, in turn']} "
        f"--batched-sessions {counts['duplexcadence, lockstep B=32']} --rounds {mimi['results'][0]['rounds']}"
    )


# --- sessions through `dsl serve` ------------------------------------------------------------------------

SERVED = (
    ("serve_minicpmo45.json", "minicpmo45", "MiniCPM-o 4.5, token2wav"),
    ("serve_mimi_bundle32.json", "moshi-lockstep", "Moshi, Mimi decoder"),
    ("serve_mimi.json", "moshi-lanes", "Moshi, Mimi decoder"),
)
"""README's serving rows: (JSON, serve_bench configuration, tail); docs/serving.md has every arrangement."""


def serving_block(json_dir: Path = DOCS) -> list[str]:
    """Sessions one GPU holds through `dsl serve` (a websocket per session, or per bundle), p99 tick latency
    under the tick period, from `scripts/serve_bench.py`'s JSON."""
    body: list[list[str]] = []
    commands: list[str] = []
    environments: list[str] = []
    for name, config, tail in SERVED:
        path = json_dir / name
        if not path.exists():
            continue
        run = json.loads(path.read_text())
        result = next(r for r in run["results"] if r["config"] == config)
        best = result["max_sessions_p99_under_period"]
        at_best = next(p for p in result["sweep"] if p["sessions"] == best)
        grouped = result.get("lockstep")
        served = f"lockstep groups of {grouped}" if grouped else "one slot a session"
        served += f", {result['lanes']} lanes"
        if result.get("bundle"):
            served += f", bundles of {result['bundle']} (a websocket each)"
        if grouped:
            differing = (
                f"{at_best['sampled_ticks_differing_from_group']} of {at_best['sampled_ticks_compared_with_group']}"
            )
            differing += " (against the group's batched stock)"
        else:
            differing = (
                f"{at_best['sampled_ticks_differing']} of {at_best['sampled_ticks_compared']} (against stock alone)"
            )
        next_count = [p for p in result["sweep"] if p["sessions"] > best]
        limit = str(best) if next_count else f"≥ {best}"  # no count failed: the limit lies beyond
        period = result["tick_period_s"] * 1000
        body.append(
            [tail, served, f"**{limit}**", f"{at_best['latency_p99_s'] * 1000:.1f} of {period:g} ms", differing]
        )
        commands.append(re.sub(r"^scripts/", "python scripts/", re.sub(r"--out \S+/", "--out ", run["command"])))
        environments.append(f"{run['gpu']}, torch {run['torch']}")
    header = ["tail", "served as", "sessions at p99 under the tick period", "p99 there", "sampled ticks differing"]
    return table(header, body) + [
        "",
        "Commands: " + ", ".join(f"`{c}`" for c in dict.fromkeys(commands)) + ".",
        f"Environment: {'; '.join(dict.fromkeys(environments))}.",
    ]


# --- torch.compile ---------------------------------------------------------------------------------------


def compile_block(json_dir: Path = DOCS) -> list[str]:
    """Per tail, the latest run with a `torch.compile` variant: what it gave, against DuplexCadence there."""
    body = []
    for tail in TAILS:
        runs = [r for r in load(tail, json_dir) if any("torch.compile" in v["name"] for v in r.get("variants") or [])]
        if not runs:
            continue
        run = runs[-1]
        compiled = next(v for v in run["variants"] if "torch.compile" in v["name"])
        if compiled.get("ms_per_s_median") is None:
            result = f"failed: {short_error(compiled.get('error'))}"
        else:
            result = f"{compiled['ms_per_s_median']:.1f} ms/s, bit-identical: {yes_no(compiled.get('bit_identical'))}"
            if compiled.get("first_mismatch"):
                result += f" ({compiled['first_mismatch'].split(', first differing')[0]})"
        ours = ", ".join(f"{v['name']} {v['ms_per_s_median']:.1f}" for v in cadence_variants(run))
        body.append([tail.title, f"`{command(run)}`", result.replace("|", "\\|"), ours])
    environments = dict.fromkeys(
        environment(run) for tail in TAILS for run in load(tail, json_dir) if run.get("variants")
    )
    header = ["tail", "command", "torch.compile reduce-overhead", "DuplexCadence in the same run, ms/s"]
    return table(header, body) + ["", f"Environment: {'; '.join(environments)}."]


# --- the live loop and the long session ----------------------------------------------------------------


def live_block(json_dir: Path = DOCS) -> list[str]:
    path = json_dir / "moshi_live.json"
    if not path.exists():
        return ["No run in `docs/benchmarks/moshi_live.json`."]
    live = json.loads(path.read_text())
    phases = [
        ("LISTEN (Mimi encode)", "shared", "listen"),
        ("THINK (`LMGen.step`, 7B)", "shared", "think"),
        ("SPEAK (Mimi decode)", "moshi stock", "speak_stock"),
        ("SPEAK (Mimi decode)", "**DuplexCadence**", "speak_duplexcadence"),
        ("frame loop", "moshi stock", "loop_stock"),
        ("frame loop", "**DuplexCadence**", "loop_duplexcadence"),
    ]
    body = []
    for phase, side, key in phases:
        frame, second = live["per_frame"][key], live["per_second"][key]
        body.append(
            [
                phase,
                side,
                f"{frame['mean_ms']:.2f}",
                f"{frame['p99_ms']:.2f}",
                f"{second['mean_ms']:.1f}",
                f"{second['mean_of_budget'] * 100:.1f} %",
            ]
        )
    header = ["phase", "side", "ms a frame, mean", "p99", "ms a second, mean", "share of the 1 s cadence"]
    env = live["environment"]
    command_text = re.sub(r"--out \S+", "--out moshi_live.json", live["command"])
    return table(header, body) + [
        "",
        f"Decoded frames `torch.equal` between the two sides: {live['frames_compared'] - live['frames_differing']} "
        f"of {live['frames_compared']}. Peak allocated {size(live['memory']['peak_allocated_bytes'])} "
        f"(the 7B LM's weights {size(live['config']['lm_bytes'])}).",
        "",
        f"`{command_text}`; {env['device_name']}, driver {env.get('driver', '?')}, torch {env['torch']}, "
        f"CUDA {env['cuda']}, moshi {env['moshi']}.",
    ]


def long_session_block(json_dir: Path = DOCS) -> list[str]:
    path = json_dir / "mimi_long_session.json"
    if not path.exists():
        return ["No run in `docs/benchmarks/mimi_long_session.json`."]
    run = json.loads(path.read_text())
    memory, start, end = run["memory"], run["graphs_start"], run["graphs_end"]
    moved = len(run["data_ptrs"]["regions_moved"]) + len(run["data_ptrs"]["state_moved"])
    minutes = run["seconds_done"] / 60
    body = [
        ["frames", f"{thousands(run['frames_done'])} of {thousands(run['frames'])} ({minutes:.0f} minutes of audio)"],
        [
            "frames `torch.equal` to moshi's, compared on the device every frame",
            f"{thousands(run['frames_done'] - run['mismatched_frames'])} of {thousands(run['frames_done'])}",
        ],
        [
            "allocated memory",
            f"{size(memory['start'])} at the start, {size(memory['after_first_interval'])} after the first "
            f"{memory['every_frames']} frames, then {memory['growth_after_first_interval']} bytes of growth",
        ],
        [
            "graphs",
            f"{start['graphs_captured']} captured at the start, {end['graphs_captured']} at the end; "
            f"{thousands(end['replays'])} replays, {end['eager_planned'] + end['eager_off_plan']} eager firings",
        ],
        ["addresses", f"{moved} regions or state tensors moved"],
        ["time", f"{run['elapsed_s']:.0f} s of stepping ({run['ms_per_frame_both_sides']:.2f} ms a frame, both sides)"],
    ]
    command_text = re.sub(r"--out \S+", "--out mimi_long_session.json", run["command"])
    return table(["check", "result"], body) + [
        "",
        f"`{command_text}`; {run['device']}, driver {run.get('driver', '?')}, torch {run['torch']}.",
    ]


# --- the pages -----------------------------------------------------------------------------------------


def blocks(json_dir: Path = DOCS) -> dict[str, list[str]]:
    """Every table by the name its page marks it with."""
    found = {"results": readme_block(json_dir), "density": density_block(json_dir), "serving": serving_block(json_dir)}
    for tail in TAILS:
        found[tail.key] = tail_block(tail, json_dir)
    found["compile"] = compile_block(json_dir)
    found["moshi-live"] = live_block(json_dir)
    found["long-session"] = long_session_block(json_dir)
    return found


def rewrite(text: str, tables: dict[str, list[str]]) -> str:
    """`text` with every marked table replaced by the current one (unknown names are left alone)."""
    out: list[str] = []
    lines = iter(text.splitlines())
    for line in lines:
        out.append(line)
        match = BEGIN.match(line)
        if not match or match.group("name") not in tables:
            continue
        for inner in lines:
            if inner == END:
                break
        else:
            raise ValueError(f"{match.group('name')}: no `{END}` after it")
        out += tables[match.group("name")] + [END]
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def marked(text: str) -> list[str]:
    return [m.group("name") for line in text.splitlines() if (m := BEGIN.match(line))]


def stale(pages=PAGES, json_dir: Path = DOCS) -> list[str]:
    """`page: NAME` for every marked table that differs from what this script prints."""
    tables = blocks(json_dir)
    found = []
    for page in pages:
        text = page.read_text()
        for name in marked(text):
            if name not in tables:
                found.append(f"{page.name}: {name} (no such table)")
            elif rewrite(block_only(text, name), {name: tables[name]}) != block_only(text, name):
                found.append(f"{page.name}: {name}")
    return found


def block_only(text: str, name: str) -> str:
    """The lines of the table NAME in `text`, its markers included."""
    lines = text.splitlines()
    start = lines.index(f"<!-- results_table.py: {name} -->")
    end = lines.index(END, start)
    return "\n".join(lines[start : end + 1]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the marked tables of README.md and docs/")
    action.add_argument("--check", action="store_true", help="exit 1 when a marked table is out of date")
    args = parser.parse_args(argv)
    if args.write:
        tables = blocks()
        for page in PAGES:
            page.write_text(rewrite(page.read_text(), tables))
            print(f"wrote {page.relative_to(ROOT)}")
        return 0
    if args.check:
        out_of_date = stale()
        for entry in out_of_date:
            print(f"out of date: {entry} (python scripts/results_table.py --write)")
        return 1 if out_of_date else 0
    for name, lines in blocks().items():
        print(f"<!-- results_table.py: {name} -->")
        print("\n".join(lines))
        print(END + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

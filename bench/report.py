"""Markdown from a bench results dict (bench/results/*.json), and a before/after comparison of two of them."""

from __future__ import annotations

from typing import Any

# Issue 8's targets: (label, how to read the value from the results, comparison, bound).
TARGETS: list[tuple[str, tuple[str, ...], str, float]] = [
    ("single tool rollouts/s", ("workloads", "single_tool", "rollouts_per_s"), ">=", 45),
    ("single tool CPU-s per 1000 (all but the mock)", ("workloads", "single_tool", "cpu_s_per_1000_total"), "<=", 45),
    ("single turn rollouts/s", ("workloads", "single_turn", "rollouts_per_s"), ">=", 60),
    ("math rollouts/s", ("workloads", "math", "rollouts_per_s"), ">=", 40),
    ("single turn state transitions", ("workloads", "single_turn", "transitions_per_rollout"), "<=", 8),
    ("math state transitions", ("workloads", "math", "transitions_per_rollout"), "<=", 8),
    ("single tool state transitions", ("workloads", "single_tool", "transitions_per_rollout"), "<=", 12),
    ("overhead reply -> next request, p50 ms", ("overhead", "reply_to_next_request", "p50_ms"), "<=", 10),
    ("overhead last reply -> persisted, p50 ms", ("overhead", "last_reply_to_persisted", "p50_ms"), "<=", 10),
]


MOCKS = ("mock", "mock slow")  # not part of gymflow: left out of the flatness check


def _within(first: float | None, last: float | None, tol: float = 0.10) -> bool | None:
    if not first or last is None:
        return None
    return abs(last - first) / abs(first) <= tol


def flatness(s: dict[str, Any]) -> dict[str, Any]:
    """Compare a late scaling window with an early one, both under full load: the first window is warm-up when
    there are three or more, and windows that end after the last task was started are the drain (fewer in flight)."""
    ws = s["windows"]
    ref_i = 1 if len(ws) >= 3 else 0
    full = [i for i, w in enumerate(ws) if w["done"] <= s["n"] - s["in_flight"]]
    last_i = max(full[-1] if full else len(ws) - 1, ref_i)
    ref, last = ws[ref_i], ws[last_i]
    flat = {key: _within(ref[key], last[key]) for key in ("rollouts_per_s", "cpu_ms_per_rollout", "p95_latency_s")}
    flat |= {f"memory {k}": _within(ref["rss_mib"].get(k), v) for k, v in last["rss_mib"].items() if k not in MOCKS}
    return {"reference_window": ref_i, "compared_window": last_i, "flat_within_10pct": flat}


def dig(results: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _met(value: Any, op: str, bound: float) -> str:
    if value is None:
        return "not measured"
    ok = value >= bound if op == ">=" else value <= bound
    return "met" if ok else "**missed**"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def targets_section(r: dict[str, Any]) -> list[str]:
    rows = [[label, f"{op} {bound:g}", fmt(dig(r, path)), _met(dig(r, path), op, bound)]
            for label, path, op, bound in TARGETS]
    curve = r.get("curve") or {}
    for p in curve.get("points", []):
        frac = p.get("fraction_of_bound")
        rows.append([f"{curve.get('latency_s', 1):g} s model: rate / model-bound at {p['in_flight']} in flight",
                     ">= 0.9", fmt(frac, 2), _met(frac, ">=", 0.9)])
    scaling = r.get("scaling")
    for key, ok in (flatness(scaling)["flat_within_10pct"] if scaling else {}).items():
        rows.append([f"scaling flat: {key}", "within 10%", fmt(ok), "met" if ok else ("-" if ok is None else
                                                                                      "**missed**")])
    return ["## Targets (issue 8)", "", *_table(["target", "bound", "measured", ""], rows)]


def workloads_section(r: dict[str, Any]) -> list[str]:
    ws = r.get("workloads") or {}
    if not ws:
        return []
    names = list(ws)

    def row(label: str, key: str, digits: int = 1) -> list[str]:
        return [label] + [fmt(ws[n].get(key), digits) for n in names]

    def per_process(label: str, key: str, digits: int) -> list[list[str]]:
        procs = list(dict.fromkeys(p for n in names for p in ws[n].get(key) or {}))
        return [[f"{label}: {p}"] + [fmt((ws[n].get(key) or {}).get(p), digits) for n in names] for p in procs]

    rows = [
        ["N (in flight)"] + [f"{fmt(ws[n].get('n'))} ({fmt(ws[n].get('in_flight'))})" for n in names],
        ["statuses"] + [", ".join(f"{k} {v}" for k, v in (ws[n].get("statuses") or {}).items()) for n in names],
        row("mean reward", "mean_reward", 2), row("rollouts/s", "rollouts_per_s"),
        ["p50 / p95 rollout latency, s"] + [f"{fmt(ws[n].get('p50_latency_s'), 2)} / "
                                            f"{fmt(ws[n].get('p95_latency_s'), 2)}" for n in names],
        row("state transitions per rollout", "transitions_per_rollout"),
        row("history bytes per rollout (JSON, sample of 20)", "history_bytes_per_rollout", 0),
        ["**CPU-s per 1000, all but the mock**"] + [f"**{fmt(ws[n].get('cpu_s_per_1000_total'))}**" for n in names],
        *per_process("CPU-s per 1000", "cpu_s_per_1000", 1),
        *per_process("peak memory MiB (PSS)", "peak_rss_mib", 0),
    ]
    generate = ws[names[0]].get("generate")
    placement = f", generation `{generate}`" if generate else ""
    return [f"## Workloads (zero-latency mock{placement})", "",
            *_table(["", *names], rows), "",
            "Process trees: Postgres and the pools include their children (backends, math-verify checkers); "
            "the client is the bench process alone; the mocks are left out of the CPU totals. Memory is PSS (resident, "
            "shared pages split between sharers), sampled every 0.5 s."]


def overhead_section(r: dict[str, Any]) -> list[str]:
    o = r.get("overhead")
    if not o:
        return []
    rows = [[label, str(s["count"]), fmt(s["p50_ms"]), fmt(s["p95_ms"]), fmt(s["mean_ms"])]
            for label, s in (("model reply sent -> next model request received", o["reply_to_next_request"]),
                             ("last model reply sent -> rollout row persisted", o["last_reply_to_persisted"]))]
    return [f"## Orchestration overhead per turn at low load ({o['workload']}, {o['n']} rollouts, 1 in flight)", "",
            *_table(["interval", "count", "p50 ms", "p95 ms", "mean ms"], rows), "",
            f"Statuses {o['statuses']}; {o['model_calls']} model calls in {o['conversations']} conversations."]


def curve_section(r: dict[str, Any]) -> list[str]:
    c = r.get("curve")
    if not c:
        return []
    rows = [[str(p["in_flight"]), f"{p['n']}{' (time cap)' if p['capped_by_time'] else ''}", fmt(p["wall_s"]),
             fmt(p["rollouts_per_s"]), fmt(p["model_bound_per_s"]), fmt(p["fraction_of_bound"], 2),
             fmt(p["p95_latency_s"], 2), ", ".join(f"{k} {v}" for k, v in p["statuses"].items())]
            for p in c["points"]]
    return [f"## Latency curve ({c['latency_s']:g} s per model call, {c['workload']})", "",
            *_table(["in flight", "N", "wall s", "rollouts/s", "model-bound/s", "fraction", "p95 latency s",
                     "statuses"], rows), "",
            f"Highest in-flight count at >= 90% of the model-bound rate: {fmt(c['highest_in_flight_at_90pct'])}. "
            f"N is 3x the in-flight count unless the zero-latency rate says that would take over "
            f"{c['time_cap_s']:g} s (marked)."]


def scaling_section(r: dict[str, Any]) -> list[str]:
    s = r.get("scaling")
    if not s:
        return []
    flat = flatness(s)
    procs = list(s["windows"][0]["rss_mib"])
    rows = [[str(w["done"]), fmt(w["rollouts_per_s"]), fmt(w["cpu_ms_per_rollout"]), fmt(w["p95_latency_s"], 2),
             *(fmt(w["rss_mib"].get(p), 0) for p in procs)] for w in s["windows"]]
    return [f"## Scaling ({s['workload']}, {s['n']} rollouts in one run, {s['in_flight']} in flight)", "",
            *_table(["done", "rollouts/s", "CPU-ms per rollout", "p95 latency s", *(f"MiB {p}" for p in procs)],
                    rows), "",
            f"Each row covers the {s['window']} rollouts before it. Flatness (targets above) compares row "
            f"{flat['compared_window'] + 1} with row {flat['reference_window'] + 1}: the first row is warm-up and rows "
            "ending after the last rollout started are the drain, with fewer in flight."]


def render(r: dict[str, Any]) -> str:
    m = r.get("meta", {})
    head = [f"# Benchmarks: latest run ({m.get('date', '?')})", "",
            f"`{m.get('command', 'python -m bench')}` on {m.get('cores', '?')} cores, load average at start "
            f"{m.get('load_at_start', '?')}; commit {m.get('commit', '?')}. Written by `python -m bench`; "
            "raw numbers in the JSON beside it.", ""]
    notes = [f"- {n}" for n in m.get("notes", [])]
    parts = [head, targets_section(r), workloads_section(r), overhead_section(r), curve_section(r),
             scaling_section(r), ["## Notes", "", *notes] if notes else []]
    return "\n".join(line for part in parts if part for line in [*part, ""]).rstrip() + "\n"


def _leaves(node: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(node, dict):
        for k, v in node.items():
            out |= _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            key = v.get("in_flight", v.get("done", i)) if isinstance(v, dict) else i
            out |= _leaves(v, f"{prefix}[{key}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        out[prefix] = float(node)
    return out


def compare(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Every number both results have, before beside after, with the change."""
    a, b = _leaves({k: v for k, v in before.items() if k != "meta"}), _leaves(
        {k: v for k, v in after.items() if k != "meta"})
    rows = []
    for key in sorted(a.keys() & b.keys()):
        change = f"{100 * (b[key] - a[key]) / abs(a[key]):+.0f}%" if a[key] else "-"
        rows.append([f"`{key}`", f"{a[key]:,.3g}", f"{b[key]:,.3g}", change])
    only = sorted(a.keys() ^ b.keys())
    lines = [f"# Before/after: {before.get('meta', {}).get('date', '?')} -> {after.get('meta', {}).get('date', '?')}",
             "", *_table(["measure", "before", "after", "change"], rows)]
    if only:
        lines += ["", f"{len(only)} measures are in only one of them (e.g. `{only[0]}`)."]
    return "\n".join(lines) + "\n"

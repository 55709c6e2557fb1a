"""Results → medians → docs/benchmarks/{results.json, results.md, *.png}."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from _contenders import Run

KAFKA_REF = "kafka"
PYTHON_REF = "python-sync"
PLOTS = ("throughput.png", "scale.png", "workers.png", "latency.png")


def describe_run(run: Run) -> str:
    if run.suite == "latency":
        e = run.extra
        return (f"{run.records:,} records; latency p50 {e['p50_ms']:.0f} ms, "
                f"p99 {e['p99_ms']:.0f} ms, max {e['max_ms']:.0f} ms")
    steady = run.rps_steady
    text = (f"{run.records:,} records in {run.wall_s:.1f} s = {run.rps_wall:,.0f} records/s "
            f"wall")
    if steady is not None:
        text += f" ({steady:,.0f} steady)"
    processed = run.extra.get("processed_s")
    if processed:
        rows = run.extra.get("task_rows") or run.extra.get("worker_rows")
        text += (f"; first → last record processed {processed:.2f} s = "
                 f"{run.records / processed:,.0f} records/s; per task {rows}")
    return text


def _median(values: list[float | None]) -> float | None:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def summarize(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per case: the medians over its runs."""
    by_case: dict[str, list[dict[str, Any]]] = {}
    for run in doc["runs"]:
        by_case.setdefault(run["case"], []).append(run)
    out: dict[str, dict[str, Any]] = {}
    for name, runs in by_case.items():
        first = runs[0]
        entry: dict[str, Any] = {
            "suite": first["suite"],
            "label": doc["cases"].get(name, {}).get("label", name),
            "runs": len(runs),
            "records": first["records"],
            "params": first["params"],
            "wall_s": _median([r["wall_s"] for r in runs]),
            "records_per_s_wall": _median([r["records_per_s_wall"] for r in runs]),
            "records_per_s_steady": _median([r["records_per_s_steady"] for r in runs]),
            "mb_per_s_wall": _median([r["mb_per_s_wall"] for r in runs]),
            "mb_per_s_steady": _median([r["mb_per_s_steady"] for r in runs]),
        }
        per_record = [_journal_bytes_per_record(r) for r in runs]
        if any(b is not None for b in per_record):
            entry["journal_bytes_per_record"] = _median([b for b in per_record if b is not None])
        if first["suite"] in ("cost", "workers", "spread"):
            entry["records_per_s_processed"] = _median(
                [r["records"] / r["extra"]["processed_s"] for r in runs
                 if r["extra"].get("processed_s")])
            ordered = sorted(runs, key=lambda r: r["extra"].get("processed_s") or 0)
            median_run = ordered[len(ordered) // 2]["extra"]
            entry["task_rows"] = median_run.get("task_rows") or median_run.get("worker_rows")
            entry["start_skew_s"] = median_run.get("start_skew_s")
        if first["suite"] == "latency":
            entry["rate"] = first["params"].get("rate")
            for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms"):
                entry[key] = _median([r["extra"][key] for r in runs])
            # the CDF of the run with the median p50
            ordered = sorted(runs, key=lambda r: r["extra"]["p50_ms"])
            entry["cdf_ms"] = ordered[len(ordered) // 2]["extra"]["cdf_ms"]
            entry["measured_records"] = ordered[len(ordered) // 2]["extra"]["measured_records"]
        out[name] = entry
    return out


def _journal_bytes_per_record(run: dict[str, Any]) -> float | None:
    """Journal bytes written per record, from the source's batch metrics (exactly-once runs
    whose batches reported them)."""
    batches = [b for b in run.get("extra", {}).get("source_batches") or [] if b]
    written = sum(b.get("journal_bytes", 0) for b in batches)
    records = sum(b.get("records", 0) for b in batches)
    return written / records if written and records else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _fmt_ratio(wall: float | None, steady: float | None) -> str:
    if wall is None:
        return "-"
    text = f"{wall:.2f}x"
    return text + (f" ({steady:.2f}x)" if steady is not None else "")


def _fmt_int(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _fmt_mb(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def derive(summary: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Ratios to the kafka source and the Python client, and the journal's overhead."""
    derived: dict[str, Any] = {"ratios": {}}
    ref_k = summary.get(KAFKA_REF)
    ref_p = summary.get(PYTHON_REF)
    for name, s in summary.items():
        if s["suite"] != "throughput":
            continue
        derived["ratios"][name] = {
            "vs_kafka_wall": _ratio(s["records_per_s_wall"],
                                    ref_k["records_per_s_wall"] if ref_k else None),
            "vs_kafka_steady": _ratio(s["records_per_s_steady"],
                                      ref_k["records_per_s_steady"] if ref_k else None),
            "vs_python_wall": _ratio(s["records_per_s_wall"],
                                     ref_p["records_per_s_wall"] if ref_p else None),
            "vs_python_steady": _ratio(s["records_per_s_steady"],
                                       ref_p["records_per_s_steady"] if ref_p else None),
        }
    eo, amo = summary.get("share-eo"), summary.get("share-amo")
    if eo and amo:
        derived["journal_overhead"] = {
            # extra time exactly-once needs for the same records, relative to at-most-once
            "wall": _ratio(eo["wall_s"], amo["wall_s"]),
            "steady": _ratio(amo["records_per_s_steady"], eo["records_per_s_steady"]),
        }
    records = summary.get("share-eo-records")
    if records and amo:
        derived["journal_overhead_records"] = {
            "wall": _ratio(records["wall_s"], amo["wall_s"]),
            "steady": _ratio(amo["records_per_s_steady"], records["records_per_s_steady"]),
        }
    nofsync = summary.get("share-eo-nofsync")
    if nofsync and amo:
        derived["journal_overhead_nofsync"] = {
            "wall": _ratio(nofsync["wall_s"], amo["wall_s"]),
            "steady": _ratio(amo["records_per_s_steady"], nofsync["records_per_s_steady"]),
        }
    native = summary.get("share-eo-native")
    if eo and native:  # issue 39: the source on the native client against librdkafka
        derived["native_vs_librdkafka"] = {
            "wall": _ratio(native["records_per_s_wall"], eo["records_per_s_wall"]),
            "steady": _ratio(native["records_per_s_steady"], eo["records_per_s_steady"]),
        }
    return derived


def markdown(doc: dict[str, Any], summary: dict[str, dict[str, Any]],
             derived: dict[str, Any]) -> str:
    sizes, m, v = doc["sizes"], doc["machine"], doc["versions"]
    lines = [
        "# kafka-share benchmark results",
        "",
        f"Generated by `bench/run.py` ({doc['mode']} mode, {sizes['rounds']} round(s), medians "
        f"shown) on {doc['created']} in {doc['elapsed_s'] / 60:.1f} min. How to read and "
        "re-run this: [README.md](README.md).",
        "",
        f"- Machine: {m['nproc']} cores ({m['cpu_model']}), {m['memory_gib']} GiB RAM, "
        f"{m['os']}",
        f"- Versions: Python {v['python']}, pyspark {v['pyspark']} (Spark master "
        f"`{doc['spark_master']}`), spark-sql-kafka {v['spark_sql_kafka']}, confluent-kafka "
        f"{v['confluent_kafka']} (librdkafka {v['librdkafka']}), pyarrow {v['pyarrow']}, "
        f"Apache Kafka {v['kafka']} (embedded single broker), {v['java']}",
        f"- Records: {doc['record']['value_bytes']}-byte values, "
        f"{doc['record']['key_bytes']}-byte keys; producer "
        + ", ".join(f"`{k}={val}`" for k, val in doc["producer_config"].items()
                    if k in ("linger.ms", "batch.size", "acks", "compression.type")),
        f"- git {doc['git']['commit']}{' (dirty)' if doc['git']['dirty'] else ''}",
        "",
    ]
    thr = {k: s for k, s in summary.items() if s["suite"] == "throughput"}
    if thr:
        first = next(iter(thr.values()))
        lines += [
            f"## Throughput: drain {first['records']:,} records from a "
            f"{sizes['partitions']}-partition topic",
            "",
            "| contender | records/s wall | MB/s wall | records/s steady | vs kafka source | "
            "vs Python client | runs |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        order = ["python-sync", "python-async", "java-perf", "share-eo", "share-eo-native",
                 "share-eo-records", "share-eo-nofsync", "share-amo", "kafka"]
        for name in sorted(thr, key=lambda n: order.index(n) if n in order else 99):
            s, r = thr[name], derived["ratios"].get(name, {})
            lines.append(
                f"| {s['label']} | {_fmt_int(s['records_per_s_wall'])} | "
                f"{_fmt_mb(s['mb_per_s_wall'])} | {_fmt_int(s['records_per_s_steady'])} | "
                f"{_fmt_ratio(r.get('vs_kafka_wall'), r.get('vs_kafka_steady'))} | "
                f"{_fmt_ratio(r.get('vs_python_wall'), r.get('vs_python_steady'))} | "
                f"{s['runs']} |")
        lines += [
            "",
            "*wall*: records ÷ seconds from start to end of the run, including startup and "
            "group joins (Spark: `start()` → termination; Python client: creating the "
            "consumers → last record acknowledged; Java tool: the JVM's whole life). "
            "*steady*: Spark: records ÷ the sum of the micro-batches' "
            "`durationMs.triggerExecution` (no query startup, but each batch's consumer joins "
            "and final poll timeout); Python client: first record → last record; Java tool: "
            "the tool's own start → end (includes its group join). Ratios: wall (steady); "
            f"the Python client reference is `{PYTHON_REF}`.",
            "",
        ]
        nv = derived.get("native_vs_librdkafka")
        if nv:
            lines += [
                "**The source on the native client** (`client=native`, exactly-once, same "
                f"run): {_fmt_ratio(nv['wall'], nv['steady'])} the source on librdkafka.",
                "",
            ]
        jo = derived.get("journal_overhead")
        nf = derived.get("journal_overhead_nofsync")
        jr = derived.get("journal_overhead_records")
        if jo:
            lines += [
                "**Journal overhead** (exactly-once vs at-most-once, same records): "
                f"exactly-once takes {_pct(jo['wall'])} wall time and "
                f"{_pct(jo['steady'])} steady-state time"
                + (f"; with `journalContent=records` {_pct(jr['wall'])} wall and "
                   f"{_pct(jr['steady'])} steady" if jr else "")
                + (f"; with `journalFsync=false` {_pct(nf['wall'])} wall and "
                   f"{_pct(nf['steady'])} steady." if nf else "."),
                "",
            ]
        written = [f"{s['label'].split(' → ')[0]}: {s['journal_bytes_per_record']:,.2f}"
                   for s in thr.values() if s.get("journal_bytes_per_record")]
        if written:
            lines += ["**Journal bytes written per record** (from the batches' "
                      "`journal_bytes`, median run): " + "; ".join(written) + ".", ""]
    rows = {k: s for k, s in summary.items() if s["suite"] == "scale"}
    if rows:
        lines += [
            "## Scale-out (kafka-share exactly-once, no per-record cost): "
            f"{sizes['scale_records']:,} records per topic, records/s wall (steady)",
            "",
            "| topic partitions | numPartitions=1 | 2 | 4 | 8 | Spark kafka source |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for p in (1, 4):
            cells = []
            for n in ("n1", "n2", "n4", "n8", "kafka"):
                cell = rows.get(f"scale-p{p}-{n}")
                cells.append("-" if cell is None else
                             f"{_fmt_int(cell['records_per_s_wall'])} "
                             f"({_fmt_int(cell['records_per_s_steady'])})")
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += _scale_out_section(
        summary, "cost", "n", "numPartitions",
        f"Scale-out with a per-record cost of {sizes['cost_ms']:g} ms (sleep in mapInArrow), "
        f"{sizes['cost_records']:,} records per topic", with_kafka=True)
    lines += _scale_out_section(
        summary, "workers", "w", "workers",
        f"Queue workers (`run_workers`, Arrow chunks) with a per-record cost of "
        f"{sizes.get('workers_ms', 2.0):g} ms, {sizes['cost_records']:,} records per topic",
        with_kafka=False)
    lines += _spread_section(summary, sizes)
    lat = {k: s for k, s in summary.items() if s["suite"] == "latency"}
    if lat:
        lines += [
            f"## End-to-end latency, {sizes['latency_seconds']:g} s of a paced producer into "
            f"{sizes['partitions']} partitions (produce → foreachBatch)",
            "",
            "| contender | records/s | records measured | p50 ms | p90 ms | p99 ms | max ms |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name in ("latency-share-eo-defaults", "latency-share-eo", "latency-share-amo",
                     "latency-kafka", "latency-low-share-eo-defaults", "latency-low-kafka"):
            row = lat.get(name)
            if row is None:
                continue
            lines.append(f"| {row['label']} | {_fmt_int(row.get('rate'))} | "
                         f"{row['measured_records']:,} | {row['p50_ms']:.0f} | "
                         f"{row['p90_ms']:.0f} | {row['p99_ms']:.0f} | {row['max_ms']:.0f} |")
        for rate_key, prefix in (("latency_rate", "latency-"), ("latency_low_rate",
                                                                 "latency-low-")):
            eo, ref = lat.get(f"{prefix}share-eo-defaults"), lat.get(f"{prefix}kafka")
            if eo and ref and ref["p50_ms"]:
                lines += ["", f"At {_fmt_int(sizes.get(rate_key))} records/s, default options: "
                          f"p50 {eo['p50_ms'] / ref['p50_ms']:.2f}x the kafka source's "
                          f"(target <= 1.3x), p99 {eo['p99_ms']:,.0f} ms (target < 1,000)."]
        lines += [
            "",
            f"Rows produced in the first {sizes['latency_warmup_s']:g} s are not counted. "
            "kafka-share runs with "
            + ", ".join(f"`{k}={val}`" for k, val in doc.get("latency_share_options",
                                                             {}).items())
            + " (otherwise defaults), except the row that says default options. All use "
            "the default (as-fast-as-possible) micro-batch trigger.",
            "",
        ]
    for plot in PLOTS:
        lines += [f"![{plot[:-4]}]({plot})", ""]
    return "\n".join(lines)


def _scale_out_section(summary: dict[str, dict[str, Any]], suite: str, key: str, what: str,
                       title: str, *, with_kafka: bool) -> list[str]:
    """A table of records/s from the first record processed to the last, with each count's
    ratio to linear scaling of the single task/worker, and the rows per task."""
    rows = {k: s for k, s in summary.items() if s["suite"] == suite}
    if not rows:
        return []
    head = f"| topic partitions | {what}=1 | 2 | 4 | 8 |" + (
        " Spark kafka source |" if with_kafka else "")
    lines = [f"## {title}", "",
             "Records/s from the first record processed to the last; in brackets, the ratio "
             f"to linear scaling of {what}=1 (the target at 8 is "
             f"{'0.8x' if suite == 'cost' else '0.9x'}).", "",
             head, "|---:|---:|---:|---:|---:|" + ("---:|" if with_kafka else "")]
    spread: list[str] = []
    for p in (1, 4):
        one = rows.get(f"{suite}-p{p}-{key}1")
        base = one and one.get("records_per_s_processed")
        cells = []
        for n in (1, 2, 4, 8):
            s = rows.get(f"{suite}-p{p}-{key}{n}")
            if s is None or not s.get("records_per_s_processed"):
                cells.append("-")
                continue
            rate = s["records_per_s_processed"]
            ratio = f" ({rate / (n * base):.2f}x)" if base and n > 1 else ""
            cells.append(f"{rate:,.0f}{ratio}")
            if s.get("task_rows"):
                spread.append(f"{p}-partition topic, {what}={n}: {s['task_rows']}")
        if with_kafka:
            ref = rows.get(f"{suite}-p{p}-kafka")
            rate = ref and ref.get("records_per_s_processed")
            cells.append(f"{rate:,.0f}" if rate else "-")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    lines += ["", "Records per task (per Spark task of each micro-batch, or per worker; "
              "median run):", ""] + [f"- {x}" for x in spread] + [""]
    return lines


def _spread_section(summary: dict[str, dict[str, Any]], sizes: dict[str, Any]) -> list[str]:
    """Issues 38 and 39: 8 native-client workers, and the source with 8 tasks on the native
    client, on one partition against one: the ratio to linear, the records per worker or task
    (max/mean) and when the last one got its first records."""
    pairs = (("spread-p1-w1", "spread-p1-w8", "workers (`run_workers`)",
              sizes.get("spread_records", 0), sizes.get("workers_ms", 2.0)),
             ("spread-src-p1-n1", "spread-src-p1-n8", "the source (numPartitions, mapInArrow)",
              sizes.get("source_spread_records", 0), sizes.get("source_spread_ms", 1.0)))
    rows: list[str] = []
    per_task: list[str] = []
    for one_name, eight_name, what, records, ms in pairs:
        one, eight = summary.get(one_name), summary.get(eight_name)
        if not (one and eight and one.get("records_per_s_processed")
                and eight.get("records_per_s_processed")):
            continue
        ratio = eight["records_per_s_processed"] / (8 * one["records_per_s_processed"])
        counts = [r for r in eight.get("task_rows") or [] if r]
        spread = f"{max(counts) / (sum(counts) / len(counts)):.2f}" if counts else "-"
        rows.append(f"| {what}, {records:,} records at {ms:g} ms | "
                    f"{one['records_per_s_processed']:,.0f} | "
                    f"{eight['records_per_s_processed']:,.0f} | {ratio:.2f}x | {spread} | "
                    f"{eight.get('start_skew_s')} s |")
        per_task.append(f"Records per worker or task, "
                        f"{what} (median run): {counts}.")
    if not rows:
        return []
    return ["## Spread: `client=\"native\"`, 8 consumers on a 1-partition topic (the workers "
            "poll with strict `record_limit`; the source's tasks only for their last two polls)",
            "",
            "| case | 1 records/s | 8 records/s | ratio to linear (target >= 0.95x) | "
            "max/mean records per worker or task (target <= 1.05) | last one's first records "
            "after the first's |", "|---|---:|---:|---:|---:|---:|", *rows, "",
            *[line for p in per_task for line in (p, "")]]


def _pct(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{(ratio - 1) * 100:+.0f}%"


def plots(summary: dict[str, dict[str, Any]], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[str] = []
    thr = [(k, s) for k, s in summary.items() if s["suite"] == "throughput"]
    if thr:
        order = ["python-sync", "python-async", "java-perf", "share-eo", "share-eo-native",
                 "share-eo-records", "share-eo-nofsync", "share-amo", "kafka"]
        thr.sort(key=lambda kv: order.index(kv[0]) if kv[0] in order else 99)
        fig, ax = plt.subplots(figsize=(9, 0.6 * len(thr) + 1.5))
        ys = range(len(thr))
        wall = [s["records_per_s_wall"] or 0 for _, s in thr]
        steady = [s["records_per_s_steady"] or 0 for _, s in thr]
        ax.barh([y + 0.2 for y in ys], wall, height=0.4, label="wall")
        ax.barh([y - 0.2 for y in ys], steady, height=0.4, label="steady")
        ax.set_yticks(list(ys), [s["label"] for _, s in thr], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("records/s")
        ax.set_title(f"Drain {thr[0][1]['records']:,} records")
        ax.legend()
        written.append(_save(fig, out / "throughput.png"))
    if any(s["suite"] in ("scale", "cost") for s in summary.values()):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        _scale_panel(axes[0], summary, "scale", "n", metric="records_per_s_wall",
                     title="no per-record cost (records/s wall)", what="numPartitions",
                     kafka=True)
        _scale_panel(axes[1], summary, "cost", "n", metric="records_per_s_processed",
                     title="per-record cost (first → last record processed)",
                     what="numPartitions", kafka=True)
        written.append(_save(fig, out / "scale.png"))
    if any(s["suite"] == "workers" for s in summary.values()):
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        _scale_panel(ax, summary, "workers", "w", metric="records_per_s_processed",
                     title="queue workers, per-record cost (first → last record processed)",
                     what="workers", kafka=False)
        written.append(_save(fig, out / "workers.png"))
    lat = [(k, s) for k, s in summary.items() if s["suite"] == "latency"]
    if lat:
        fig, ax = plt.subplots(figsize=(8, 4.2))
        for _, s in lat:
            cdf = s["cdf_ms"]
            if cdf:
                ax.plot(cdf, [i / 100 for i in range(len(cdf))],
                        label=f"{s['label']} (p50 {s['p50_ms']:.0f} ms, "
                        f"p99 {s['p99_ms']:.0f} ms)")
        ax.set_xscale("log")
        ax.set_xlabel("latency, produce → foreachBatch (ms)")
        ax.set_ylabel("fraction of records")
        ax.set_title("End-to-end latency (CDF)")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(True, which="both", alpha=0.3)
        written.append(_save(fig, out / "latency.png"))
    return written


def _save(fig: Any, path: Path) -> str:
    """Write ``fig`` to ``path`` (PNG) and close it; the file's name."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _scale_panel(ax: Any, summary: dict[str, dict[str, Any]], suite: str, key: str, *,
                 metric: str, title: str, what: str, kafka: bool) -> None:
    """One scale-out panel: records/s against the task (worker) count per topic, with the
    linear scaling of the single one (dotted) and the kafka source (dashed)."""
    for p, color in ((1, "tab:blue"), (4, "tab:orange")):
        xs, ys = [], []
        for n in (1, 2, 4, 8):
            s = summary.get(f"{suite}-p{p}-{key}{n}")
            if s is not None and s.get(metric):
                xs.append(n)
                ys.append(s[metric])
        if not xs:
            continue
        ax.plot(xs, ys, marker="o", color=color, label=f"{p}-partition topic")
        if metric == "records_per_s_processed" and xs[0] == 1:
            ax.plot([1, 2, 4, 8], [n * ys[0] for n in (1, 2, 4, 8)], color=color,
                    linestyle=":", alpha=0.6, label=f"linear, {p}-partition topic")
        ref = summary.get(f"{suite}-p{p}-kafka") if kafka else None
        if ref is not None and ref.get(metric):
            ax.axhline(ref[metric], color=color, linestyle="--",
                       label=f"kafka source, {p}-partition topic")
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    ax.set_xlabel(f"{what}" + (" (Spark tasks = share consumers)" if kafka else ""))
    ax.set_ylabel("records/s")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)


def publish(doc: dict[str, Any], out: Path) -> None:
    """Write results.json (raw runs + medians), results.md and the PNG plots into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(doc)
    derived = derive(summary)
    written = plots(summary, out)
    full = {**doc, "summary": summary, "derived": derived}
    (out / "results.json").write_text(json.dumps(full, indent=1) + "\n")
    text = markdown(doc, summary, derived)
    # only link the plots that exist
    for name in PLOTS:
        if name not in written:
            text = text.replace(f"![{name[:-4]}]({name})\n\n", "")
            text = text.replace(f"![{name[:-4]}]({name})\n", "")
    (out / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    import sys

    src = json.loads(Path(sys.argv[1]).read_text())
    publish(src, Path(sys.argv[2]) if len(sys.argv) > 2 else Path(sys.argv[1]).parent)

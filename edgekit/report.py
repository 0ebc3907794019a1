"""Render reports for people: the bench table and the convert summary."""

from __future__ import annotations

from typing import Any

from edgekit.errors import Namer, api_name, render_params


def _fmt(value: Any, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _size(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.2f} MiB"


def _open_size_lines(report: dict[str, Any]) -> list[str]:
    return [f"{m['path'].rsplit('/', 1)[-1]}: open input size, timed at {m['timed_input_shape']} (the first "
            "--data sample's)" for m in report["models"] if m.get("timed_input_shape")]


def bench_table(report: dict[str, Any]) -> str:
    """A fixed-width table, one row per model, with the reference's accuracy above it."""
    cols = ["model", "mode", "size", "init ms", "first ms", "p50 ms", "p90 ms", "p99 ms",
            "mean±std ms", "inf/s", "top1 %", "Δ pts", "agree %", "SNR dB"]
    hosts = any("host" in m for m in report["models"])
    if hosts:
        cols.insert(1, "host")
    speedups = report.get("baseline") is not None
    if speedups:
        cols.insert(cols.index("inf/s") + 1, "speed-up")
    rows = []
    for m in report["models"]:
        lat, acc = m["latency_ms"], m.get("accuracy") or {}
        rows.append([
            m["path"].rsplit("/", 1)[-1],
            *([m["host"]] if hosts else []),
            m.get("mode") or "?",
            _size(m["size_bytes"]),
            _fmt(lat["init"], ".1f"),
            _fmt(lat["first"], ".2f"),
            _fmt(lat["p50"], ".3f"),
            _fmt(lat["p90"], ".3f"),
            _fmt(lat["p99"], ".3f"),
            f"{lat['mean']:.3f}±{lat['std']:.3f}",
            _fmt(m.get("throughput_per_s"), ".0f"),
            *([_fmt(m.get("speedup"), ".2f") + ("x" if m.get("speedup") is not None else "")] if speedups else []),
            _fmt(None if acc.get("top1") is None else 100 * acc["top1"], ".2f"),
            _fmt(acc.get("top1_delta_points"), "+.2f"),
            _fmt(None if acc.get("agreement") is None else 100 * acc["agreement"], ".2f"),
            _fmt(acc.get("snr_db"), ".1f"),
        ])
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    left = 3 if hosts else 2

    def line(cells):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = []
    s = report.get("settings") or {}
    backend = report["models"][0]["backend"] if report["models"] else "?"
    if hosts:
        out.append(f"threads={s.get('threads')} runs={s.get('runs')} warmup={s.get('warmup')}, on each device:")
        out.extend(device_lines(report))
    else:
        out.append(f"threads={s['threads']} runs={s['runs']} warmup={s['warmup']} backend={backend}")
    out.extend(_open_size_lines(report))
    if report.get("baseline"):
        out.append(f"speed-up: p50 of {report['baseline'].rsplit('/', 1)[-1]} over each model's (measured one after "
                   "the other in this run)")
    for m in report["models"]:
        sparse = m.get("sparse_weights")
        if sparse:
            out.append(f"sparse weights: {m['path'].rsplit('/', 1)[-1]} stores {sparse['tensors']} kernel(s) sparse; "
                       f"{sparse['why']}")
    if report.get("data"):
        d = report["data"]
        if d.get("format", "folder") == "folder":
            out.append(f"data: {d['path']} ({d['samples']} images, {d['classes']} classes)")
        else:
            labels = f"{d['classes']} classes" if d.get("labelled") else "no labels: top-1 not measured"
            out.append(f"data: {d['path']} ({d['samples']} samples, {labels})")
    if report.get("reference"):
        out.append(_reference_line(report))
    out.append(line(cols))
    out.append(line(["-" * w for w in widths]))
    out.extend(line(r) for r in rows)
    out.extend(_verdict_lines(report["models"]))
    out.extend(_per_output_lines(report["models"]))
    return "\n".join(out)


_THROTTLED: dict[object, str] = {True: "THROTTLED", False: "not throttled"}  # a device's "throttled", in words


def device_lines(report: dict[str, Any]) -> list[str]:
    """One line per host that answered: what it is and how it was (governor, temperature, throttling)."""
    out, seen = [], set()
    for m in report["models"]:
        host, d = m.get("host"), m.get("device") or {}
        if host in seen or not d:
            continue
        seen.add(host)
        cpu = f"{d.get('cpu') or '?'} x{d.get('cores') or '?'}"
        state = [f"governor {d['governor']}" if d.get("governor") else None,
                 f"{d['temperature_c']:.1f} °C" if d.get("temperature_c") is not None else None,
                 _THROTTLED.get(d.get("throttled"))]
        out.append(f"  {host}: {d.get('hostname')}, {d.get('machine')}, {cpu}, {d.get('os')}, Python {d.get('python')}, "
                   f"{m['backend']} {m['backend_version']}" + "".join(f", {x}" for x in state if x))
    return out


def _reference_line(report: dict[str, Any]) -> str:
    """The float model compared against, what ran it and its top-1; with `--on`, run on each device (its
    runtime is in the device lines), one top-1 where the devices agree, else each host's."""
    ref = report["reference"]
    runs = [(h["host"], h["reference"]) for h in report.get("hosts") or [] if h.get("reference")]
    if not runs:
        top1 = "" if ref["top1"] is None else f": top1 {100 * ref['top1']:.2f}%"
        runner = ref["device"] if ref["format"] == "tflite" else f"TensorFlow on {ref['device']}"
        return f"reference: {ref['path']} ({ref['format']}, {runner}){top1}"
    scores = {host: r["top1"] for host, r in runs if r["top1"] is not None}
    if len(set(scores.values())) == 1:
        top1 = f": top1 {100 * next(iter(scores.values())):.2f}%"
    else:
        top1 = "".join(f"{', ' if i else ': top1 '}{host} {100 * t:.2f}%" for i, (host, t) in enumerate(scores.items()))
    return f"reference: {ref['path']} ({ref['format']}, run on each device){top1}"


def _verdict_lines(models: list[dict[str, Any]]) -> list[str]:
    """With `--reference`: each model's paired verdict against the float model (its 95 % interval), and a
    collapse where one was found."""
    out = []
    for m in models:
        acc = m.get("accuracy") or {}
        cmp, collapse = acc.get("comparison"), acc.get("collapse")
        name = m["path"].rsplit("/", 1)[-1] + (f" on {m['host']}" if m.get("host") else "")
        if cmp and cmp.get("change_interval"):
            low, high = cmp["change_interval"]
            out.append(f"{name}: against the reference, top-1 {cmp['change_points']:+.2f} points (95 % interval "
                       f"{low:+.2f} to {high:+.2f}): {cmp['verdict']}")
        elif cmp:
            out.append(f"{name}: against the reference, {cmp['verdict']}" + (f"; {cmp['hint']}" if cmp["hint"] else ""))
        if collapse and collapse["collapsed"]:
            out.append(f"{name}: {collapse['verdict']}")
    return out


def _per_output_lines(models: list[dict[str, Any]]) -> list[str]:
    """With `--reference`, for models with several outputs: each output's error against the float model,
    the one the top-1 and agree columns score marked *. Nothing for single-output models."""
    out = []
    for m in models:
        acc = m.get("accuracy") or {}
        outputs = acc.get("outputs") or {}
        if len(outputs) < 2:
            continue
        name = m["path"].rsplit("/", 1)[-1]
        out.append(f"{name}: per output against the float model (top1, agree and SNR columns: {acc['output']})")
        width = max(len(k) for k in outputs)
        for key, o in outputs.items():
            agree = "-" if o["agreement"] is None else f"{100 * o['agreement']:.2f}%"
            out.append(f"  {'*' if key == acc['output'] else ' '} {key.ljust(width)}  {o['role']:6}  "
                       f"max abs err {o['max_abs_error']:<9.4g}  mean abs err {o['mean_abs_error']:<9.4g}  "
                       f"SNR {o['snr_db']:6.1f} dB  agree {agree}")
    return out


def convert_summary(result, verbose: bool = False) -> str:
    """`edgekit convert` for people: one short line per result; with `verbose`, how each was reached."""
    meta = result.metadata
    lines = [f"wrote {result.path} ({meta['mode']}, io {meta['io']}, {_size(result.size_bytes)}) "
             f"in {result.seconds:.1f} s" + autopilot_wrote(meta.get("autopilot"))]
    if autopilot_wrote(meta.get("autopilot")):
        lines.append(f"why {meta['autopilot']['chosen_mode']}: {meta['autopilot']['reason']}")
    lines.extend(getattr(result, "changes", ()))  # what edgekit chose where the user did not say
    calib = meta.get("calibration") or {}
    if calib and calib.get("requested", 0) > calib["samples"]:
        lines.append(f"calibrated on all {calib['samples']} samples of {calib['source']} "
                     f"(--calib-samples asked for {calib['requested']})")
    lines.append(verified_line(meta.get("verification"), verbose))
    if calib.get("range_setting"):
        lines.append(range_line(calib["range_setting"]) if verbose else range_brief(calib["range_setting"]))
    if meta.get("autopilot"):
        said = autopilot_lines(meta["autopilot"])
        lines.extend(said if verbose else [said[0], said[-1]])
    if meta.get("compression"):
        lines.extend(compression_lines(meta["compression"], verbose))
    if verbose and meta.get("timing"):
        lines.append(timing_line(meta["timing"], (calib.get("range_setting") or {}).get("seconds")))
    if verbose:
        lines.extend(f"note: {note}" for note in getattr(result, "notes", ()))
    return "\n".join(lines)


def timing_line(timing: dict[str, float], choosing: float | None = None) -> str:
    """'time by stage: load 3.1 s, calibrate 0.4 s, quantize 9.8 s (the int8 choice 8.0 s), verify 0.9 s'."""
    parts = [f"{stage} {seconds:.1f} s" + (f" (the int8 choice {choosing:.1f} s)" if stage == "quantize" and choosing
                                          else "") for stage, seconds in timing.items()]
    return "time by stage: " + ", ".join(parts)


def verified_line(v: dict[str, Any] | None, verbose: bool = True) -> str:
    """The .tflite against the float model; short: agreement (or the largest error) and SNR."""
    if not v:
        return "not verified against the float model: pass --calib to check it on real samples"
    agree = None if v["top1_agreement"] is None else f"{100 * v['top1_agreement']:.1f} %{_within(v, verbose)}"
    if not verbose:
        kind = "held-out" if v.get("data") == "held-out" else "calibration"
        what = f"top-1 agreement {agree}" if agree else f"max abs error {v['max_abs_error']:.3g}"
        return f"verified on {v['samples']} {kind} samples: {what}, SNR {v['snr_db']:.1f} dB"
    kind = "held-out samples (not used for calibration)" if v.get("data") == "held-out" else "calibration samples"
    return (f"verified on {v['samples']} {kind}: top-1 agreement {agree or '-'}, max abs error "
            f"{v['max_abs_error']:.3g}, mean abs error {v['mean_abs_error']:.3g}, SNR {v['snr_db']:.1f} dB")


def _within(v: dict[str, Any], verbose: bool = True) -> str:
    """' (95 % interval 94.9-98.7 %, n=360)' after an agreement (short: ' (94.9-98.7 % at 95 %)', the line
    names n), where the entry has its interval (files verified by older edgekit have none)."""
    ci = v.get("top1_agreement_interval")
    if not ci:
        return ""
    span = f"{100 * ci[0]:.1f}-{100 * ci[1]:.1f} %"
    return f" (95 % interval {span}, n={v['samples']})" if verbose else f" ({span} at 95 %)"


def range_brief(r: dict[str, Any]) -> str:
    """Which int8 ranges were kept, in one short line (`range_line` says how they were chosen)."""
    line = f"int8 ranges: {_chosen(r)}"
    if r["requested"] == "auto":
        e = r.get("escalation") or {}
        scored = len(r["candidates"]) - bool(e.get("ran"))  # the cheap candidates; weight rounding after
        rounding = (f", weight rounding {'kept' if e['kept'] else 'not kept'} ({e['seconds']:.1f} s)"
                    if e.get("ran") else "")
        head = ", logits and softmax in float" if (r.get("float_head") or {}).get("kept") else ""
        replaced = (f", {r['replaced']}'s file agreed less on the verification samples: min/max's written"
                    if r.get("replaced") else "")
        line += (f" (--calib-method auto: {scored} of {scored + len(r.get('skipped') or {})} scored{rounding}{head}"
                 f"{replaced}; -v for how)")
    return line + (f" ({r['note']})" if r.get("note") else "")


def _chosen(r: dict[str, Any]) -> str:
    """The candidate kept; GPTQ's with the ranges its kernels were rounded on."""
    on = (r.get("weight_rounding") or {}).get("on")
    return f"{r['chosen']} on {on}'s ranges" if on and on != "minmax" else r["chosen"]


def _escalation(e: dict[str, Any] | None) -> str:
    """'; weight rounding (...)': whether GPTQ followed the cheap candidates and what it cost."""
    if not e:
        return ""
    if not e["ran"]:
        return f"; weight rounding not scored ({e['why']}; --calib-effort {e['effort']})"
    return (f"; weight rounding (gptq on {e['on']}'s ranges, --calib-effort {e['effort']}): "
            f"{'kept' if e['kept'] else 'not kept'} against {e['against']}, {e['seconds']:.1f} s"
            + (f" ({e['why']})" if e.get("why") else ""))


def _float_head(h: dict[str, Any] | None) -> str:
    """'; float head (...)': whether the logits' op and the SOFTMAX were scored in float, and kept."""
    if not h:
        return ""
    if not h["ran"]:
        return f"; float head not scored ({h['why']})"
    return (f"; float head ({len(h['ops'])} ops, {100 * h['weights_share']:.2f} % of the weights): "
            f"{'kept' if h.get('kept') else 'not kept'} against {h['against']}" + (f" ({h['why']})" if h.get("why") else ""))


def _decisions(r: dict[str, Any]) -> str:
    """'; decided at level 0.0021 (...)': each comparison, the winner so far against the candidate, its p and n."""
    decided = r.get("decisions") or []
    if not decided:
        return ""
    test = r.get("test") or {}
    level = (f" (Wilcoxon, each at {test['alpha']:.2g}: 5 % over {test['comparisons']} comparisons x "
             f"{test['looks']} looks)") if test else ""
    def one(d: dict[str, Any]) -> str:
        p = "-" if d["p"] is None else f"{d['p']:.2g}"
        return f"{d['candidate']} over {d['against']} p={p} at n={d['n']} {'kept' if d['kept'] else 'not kept'}"

    parts = [one(d) for d in decided]
    return f"; decided{level}: " + ", ".join(parts)


def _verification_check(r: dict[str, Any]) -> str:
    """'; checked against min/max's file on ...': auto's file against the converter's own on the verification
    samples, and what was written."""
    v = r.get("verification_check")
    if not v:
        return ""
    chosen = r.get("replaced") or r["chosen"]
    p = "" if v["p"] is None else f", p={v['p']:.2g}"
    done = "kept" if v["kept"] else "worse at 95 %: min/max's file written instead"
    return (f"; {chosen}'s file checked against min/max's on {v['n']} verification samples ({v['measure']} "
            f"{v['chosen']:.4g} vs {v['minmax']:.4g}{p}): {done}")


def range_line(r: dict[str, Any]) -> str:
    """How the int8 activation ranges were chosen, with what each candidate measured."""
    def one(name: str, s: dict[str, Any]) -> str:
        agree = "" if s["agreement"] is None else f"{100 * s['agreement']:.2f}% / "
        loss = f" / {s['loss']:.3g}" if "loss" in s else ""
        return f"{name} {agree}{s['snr_db']:.1f} dB{loss}"

    line = f"int8 ranges: {_chosen(r)}"
    if r["candidates"]:
        on = "logit " if r.get("scored_output") == "logits" else ""
        kl = f" / mean {r['loss']}" if r.get("loss") else ""
        if r.get("scoring") == "held_out":
            how = f"fitted on the calibration samples, scored on {r['scored_on']} past them"
        else:
            extra = f" ({r['extra_samples']} past the calibration set)" if r.get("extra_samples") else ""
            how = f"two-fold on {r['scored_on']} samples{extra}"
        line += (f" (--calib-method {r['requested']}; {how}, agreement / {on}SNR{kl} vs float: "
                 + ", ".join(one(n, s) for n, s in r["candidates"].items()) + ")")
    eq = r.get("equalization")
    if eq:
        line += (f"; cross-layer equalisation: {eq['pairs']} layer pair(s), channels moved apart by up "
                 f"to {eq['largest_factor']:.3g}x" + ("" if eq["candidate"] else " (too small a move: not scored)"))
    by_reason: dict[str, list[str]] = {}
    for name, why in (r.get("skipped") or {}).items():
        by_reason.setdefault(why, []).append(name)
    e = r.get("escalation")
    if e and not e["ran"] and e["why"] in by_reason:  # the reason the cheap ones were not scored either
        by_reason[e["why"]].append("weight rounding")
        e = None
    for why, names in by_reason.items():
        line += f"; not scored: {', '.join(names)} ({why})"
    line += _escalation(e) + _float_head(r.get("float_head")) + _decisions(r) + _verification_check(r)
    if r.get("note"):
        line += f" ({r['note']})"
    return line


def autopilot_wrote(a: dict[str, Any] | None) -> str:
    """The end of convert's first line where the autopilot handed back another mode than int8: which, why,
    and where the int8 file it found went."""
    if not a or not a.get("int8_file"):
        return ""
    why = "it dominates the int8 file" if a["reason"].startswith("the int8 file is dominated") else "see why below"
    return f": {a['chosen_mode']}, not int8 ({why}; the int8 file is {a['int8_file']})"


def autopilot_lines(a: dict[str, Any]) -> list[str]:
    """The accuracy-budget autopilot's decisions and what each cost; the last line the file handed back
    (its budget verdict on the interval) and why."""
    plain = a.get("plain_int8_comparison")
    lines = [f"accuracy budget {a['budget_points']:g} points on {a['eval_data']}: plain int8 loses "
             f"{a['plain_int8_drop']:.2f}" + (f" ({plain['verdict']})" if plain else "")]
    lines.extend(_search_lines(a))
    if a.get("candidates"):
        lines.extend(_candidate_lines(a))
    return lines


def _candidate_lines(a: dict[str, Any]) -> list[str]:
    """Each file compared (size, p50, against the float model) and the one handed back."""
    lines = []
    for c in a["candidates"]:
        p50 = "-" if c["p50_ms"] is None else f"{c['p50_ms']:.3g} ms"
        notes = [f"dominated by {c['dominated_by']}"] if c.get("dominated_by") else []
        notes += [c["refused"]] if c.get("refused") else []
        lines.append(f"  {c['name']}: {_size(c['size_bytes'])}, p50 {p50} (one thread), {c['comparison']['verdict']}, "
                     f"budget {c['budget']}" + "".join(f"; {n}" for n in notes))
    budget = a["budget"]
    why = "" if a.get("int8_file") else f"; handed back {a['chosen']}: {a['reason']}"  # else convert's first line
    lines.append(f"  budget {budget['status']} for {a['chosen']}: {budget['message']}{why}")
    return lines


def _search_lines(a: dict[str, Any]) -> list[str]:
    """The int8 search: each decision and what it cost, then what it reached (on the point estimate)."""
    lines = []
    if a.get("below_resolution"):
        lines.append(f"  the budget is below what the evaluation data resolves (one image = "
                     f"{a['resolution_points']:.2f} points): ties go to agreement with the float model")
    if not a["decisions"]:
        lines.append("  within budget: nothing changed" if a["met"] else "  no clipped range or layer in float helped")
        return lines
    for d in a["decisions"]:
        action = d.get("action", "float")
        wide = action.endswith(":int16x8")  # the accumulating search with int16 activations, not float
        where = "at int16 activations (int16x8)" if wide else "in float"
        if action.startswith("accumulate"):
            n, ops = (d["tensors_in_int16"], d["ops_in_int16"]) if wide else (d["tensors_in_float"], d["ops_in_float"])
            what = f"the first {n} tensor(s) in graph order" if action.endswith(":graph") else \
                f"the {n} most sensitive tensor(s)"
            what, kept = f"{what} {where}, {ops} op(s)", (
                " (meets the budget)" if d["kept"] else "")
        elif action.startswith("unneeded"):
            what = f"{_short(d['tensor'])}... back in int8"
            kept = " (not needed: taken out)" if d["kept"] else f" (needed: kept {where})"
        else:
            what = (f"{len(d['keep_float'])} op(s) in float" if not action.startswith("clip")
                    else f"range {action}") + f" ({_short(d.get('tensor') or d['keep_float'][0])}...)"
            kept = "" if d.get("kept", True) else " (did not help: dropped)"
        lines.append(f"  + {what}: drop {d['drop']:.2f}, size {d['size_cost_bytes']:+,} B, "
                     f"p50 {d['latency_cost_ms']:+.4f} ms{kept}")
    if a.get("int16_refused"):
        lines.append(f"  int16x8 mixes not used: {a['int16_refused']}")
    choice = a.get("latency_choice")
    if choice:
        timed = "; ".join(f"{m['name']} {m['p50_ms']:.3f} ms" for m in choice["mixes"])
        lines.append(f"  {len(choice['mixes'])} mixes met the budget: {choice['chosen']} kept, {choice['reason']} "
                     f"(p50, one thread: {timed}); the other mixes above are not in the file")
    f16 = a.get("float16_weights")
    if f16:
        lines.append(f"  float16 weights for the float ops: drop {f16['drop']:.2f}, {f16['size_saved_bytes']:,} B smaller"
                     + ("" if f16["kept"] else " (lost accuracy: float32 weights kept)"))
    verdict = "met" if a["met"] else "NOT met, kept the best found"
    if not a["met"] and a.get("every_op_float_drop") is not None:
        verdict += f" (every op in float loses {a['every_op_float_drop']:.2f})"
    clipped = f", {len(a.get('clipped') or {})} range(s) clipped" if a.get("clipped") else ""
    wide = f", {len(a['int16_ops'])} at int16 activations ({100 * a['int16_share']:.0f}%)" if a.get("int16_ops") else ""
    lines.append(f"  {verdict}: {len(a['float_ops'])} of {a['total_ops']} ops in float "
                 f"({100 * a['float_share']:.0f}%){wide}{clipped}, drop {a['drop']:.2f} points")
    return lines


def _short(tensor: str) -> str:
    return tensor.split(";")[0][-48:]


def _by_class(layers: dict[str, str]) -> str:
    """'9 LayerNormalization, 4 LayerScale layer(s)': layer -> class counted by class, most first."""
    counts: dict[str, int] = {}
    for kind in layers.values():
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=lambda kv: -kv[1])) + " layer(s)"


def _channel_lines(p: dict[str, Any]) -> list[str]:
    ch = p["channels"]
    (macs, small_macs), (params, small_params) = ch["macs"], ch["parameters"]
    lines = [f"channel pruning ({p['sparsity']:g} of each prunable layer's output channels): {len(p['layers'])} "
             f"layer(s) narrowed; multiply-adds {macs:,} -> {small_macs:,} ({small_macs / max(macs, 1):.2f}x), "
             f"parameters {params:,} -> {small_params:,} ({small_params / max(params, 1):.2f}x)"]
    narrowed = [f"{name} {before}->{after}" for name, (before, after) in ch["kept"].items() if after < before]
    lines.append("  channels kept: " + ", ".join(narrowed[:12]) + (f", ... ({len(narrowed)} layers)"
                                                                     if len(narrowed) > 12 else ""))
    by_reason: dict[str, list[str]] = {}
    for name, why in ch["left"].items():
        by_reason.setdefault(why, []).append(name)
    for why, names in list(by_reason.items())[:4]:
        lines.append(f"  kept whole ({why}): {', '.join(names[:6])}" + (" ..." if len(names) > 6 else ""))
    return lines


def compression_lines(c: dict[str, Any], verbose: bool = True) -> list[str]:
    """Pruning / QAT results as measured on the exported file; without `verbose`, the results alone (no
    per-layer rows, how the fine-tune ran, or how long each stage took)."""
    if not verbose:
        return _compression_brief(c)
    lines = []
    if c.get("prune") and c["prune"].get("channels"):
        lines.extend(_channel_lines(c["prune"]))
    elif c.get("prune"):
        p = c["prune"]
        lines.append(f"pruned {len(p['layers'])} layer(s) to {p['sparsity']:g} ({p['structure']}, {p['schedule']}): "
                     f"{p['achieved']:.4f} of their kernel weights are zero in the .tflite")
    for k in c["kernels"]:
        group = f", min zeros per group {k['min_zeros_per_group']}" if "min_zeros_per_group" in k else ""
        stored = ", stored sparse" if k.get("stored") == "sparse" else ""
        lines.append(f"  {k['layer'] or k['tensor'][:40]:24} {k['op']:18} {k['shape']!s:18} "
                     f"sparsity {k['sparsity']:.4f}{group}{stored}")
    d = c.get("distill")
    if d and d.get("why"):
        lines.append(f"fine-tuned on the labels only: {d['why']}")
    elif d:
        weights = ", ".join(f"{name} {w:g}" for name, w in d["outputs"].items())
        lines.append(f"fine-tuned towards the original model's outputs (weight {weights}; the labels the rest; "
                     f"temperature {d['temperature']:g})")
    a = c.get("weight_average")
    if a:
        bn = (f"; {a['batch_norm_layers']} BatchNorm layer(s) re-estimated over {a['batches']} training batches"
              if a["batch_norm_layers"] else "")
        lines.append(f"fine-tune ended on a moving average of its weights (decay {a['decay']:g}){bn}")
    if c.get("qat"):
        lines.append(f"quantization-aware training: {c['qat']['activation_ranges']} activation ranges started from "
                     f"{c['qat']['range_samples']} training samples")
        if c["qat"].get("dead_ranges"):
            lines.append(f"{len(c['qat']['dead_ranges'])} activation range(s) stayed [0, 0] in training (a ReLU dead "
                         f"on every training image), written as [0, 1]: {', '.join(c['qat']['dead_ranges'][:3])}")
        lines.extend(_kept_float_lines(c["qat"]))
    lines.extend(_measured_lines(c))
    lines.append("stages: " + ", ".join(f"{s['stage']} {s['seconds']:.1f} s" for s in c["stages"]))
    if c.get("replicas", 1) > 1:
        lines.append(f"fine-tuned on {c['replicas']} replicas (MirroredStrategy)")
    return lines


def _compression_brief(c: dict[str, Any]) -> list[str]:
    lines = []
    p = c.get("prune")
    if p and p.get("channels"):
        (macs, small_macs), (params, small_params) = p["channels"]["macs"], p["channels"]["parameters"]
        lines.append(f"channel pruning ({p['sparsity']:g}): {len(p['layers'])} layer(s) narrowed, multiply-adds "
                     f"{small_macs / max(macs, 1):.2f}x, parameters {small_params / max(params, 1):.2f}x")
    elif p:
        lines.append(f"pruned {len(p['layers'])} layer(s) to {p['sparsity']:g} ({p['structure']}): "
                     f"{p['achieved']:.4f} of their kernel weights are zero")
    if c.get("qat"):
        lines.extend(_kept_float_lines(c["qat"]))
    return lines + _measured_lines(c)


def _kept_float_lines(qat: dict[str, Any]) -> list[str]:
    """The layers QAT could not quantize (trained in float, their output quantized), and which stayed float."""
    kept = qat.get("kept_float") or {}
    if not kept:
        return []
    lines = ["trained with only their output quantized (no QAT config in tfmot): " + _by_class(kept)]
    in_file = qat.get("float_in_file")
    if in_file is not None:
        lines.append("  float ops in the .tflite: " + (_by_class(in_file) if in_file else "none of them")
                     + (f"; {qat['other_float_ops']} other float op(s)" if qat.get("other_float_ops") else ""))
    return lines


def _measured_lines(c: dict[str, Any]) -> list[str]:
    """gzip sizes and accuracy at each stage of a fine-tune (or why accuracy was not measured)."""
    lines = ["gzip size: " + " -> ".join(f"{k} {_size(v)}" for k, v in c["gzip_bytes"].items())]
    acc, scores = c.get("accuracy") or {}, c.get("scores") or {}
    if scores:
        for output, metric in c["metrics"].items():
            shown = (lambda v: f"{100 * v:.2f}%") if metric != "mse" else (lambda v: f"{v:.4g}")
            lines.append(f"{output} {metric} on {c.get('val_data')}: "
                         + " -> ".join(f"{k} {shown(v[output])}" for k, v in scores.items() if output in v))
    elif acc:
        lines.append("top-1 on " + str(c.get("val_data")) + ": " + " -> ".join(f"{k} {100 * v:.2f}%" for k, v in acc.items()))
    if not acc and not scores:
        lines.append("accuracy not measured: too few training samples to hold some out; pass --val-data DIR")
    return lines + _held_out_lines(c)


def _held_out_lines(c: dict[str, Any]) -> list[str]:
    """Each stage against the original model on the held-out data with its interval, the pruning fine-tune's
    held-out curve, the drop against --warn-drop and the budget check: "final: 62.6 % vs float 98.3 %: loses
    31.9-40.2 points at n=216"."""
    acc, lines = c.get("accuracy") or {}, []
    for stage, comparison in (c.get("comparisons") or {}).items():
        if stage in acc and "float" in acc:
            lines.append(f"  {stage}: {100 * acc[stage]:.1f} % vs float {100 * acc['float']:.1f} %: "
                         f"{comparison['verdict']}")
    if c.get("held_out_curve"):
        lines.append("  held-out top-1 over the pruning fine-tune (before, then after each epoch): "
                     + " -> ".join(f"{100 * v:.1f} %" for v in c["held_out_curve"]))
    drop = c.get("drop")
    if drop and not drop.get("warning"):
        how = "on its interval" if drop["verdict"]["status"] == "met" else "on its point estimate (the interval straddles it)"
        lines.append(f"  final within --warn-drop {drop['warn_drop']:g} {how}")
    check = c.get("budget_check")
    if check:
        lines.append(f"--max-drop checked against the original model on {check['eval_data']}: "
                     f"{check['verdict']['message']}")
    return lines


def _share(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {100 * v:.1f}%" for k, v in sorted(d.items(), key=lambda kv: -kv[1]) if v) or "-"


def _accelerator_lines(r: dict[str, Any], name: Namer) -> list[str]:
    """inspect's GPU delegate analysis, and the verdict for `--target`."""
    out, gpu = [], r.get("gpu")
    if gpu and gpu.get("checked"):
        if gpu["compatible"]:
            out.append("GPU delegate: all ops supported")
        else:
            out.append(f"GPU delegate: takes {100 * gpu['op_share']:.0f}% of ops and {100 * gpu['weight_share']:.0f}% "
                       f"of weights; falls back to CPU for:")
            out.extend(f"  #{o['index']} {o['op']}: {o['reason']}" for o in gpu["fallback_ops"])
            if gpu.get("open_dimension") and not r.get("target"):
                out.append(f"  why: {render_params(gpu['open_dimension']['cause'], name)}")
    elif gpu:
        out.append(f"GPU delegate: not checked ({gpu.get('reason')})")
    if r.get("target"):
        out.extend(f"target {r['target']['name']}: {render_params(note, name)}" for note in r["target"]["notes"])
    return out


def inspect_text(r: dict[str, Any], name: Namer = api_name) -> str:
    """`edgekit inspect` for people; `name` names the parameters its advice mentions (the CLI: its flags)."""
    out = [f"{r['path'] or 'model'}: {_size(r['size_bytes'])}, schema v{r['schema_version']}, "
           f"{r['subgraphs']} subgraph(s), {r['ops']['count']} ops"]
    for key in ("inputs", "outputs"):
        for t in r[key]:
            q = f", scale {t['scale']:.6g}, zero point {t['zero_point']}" if t["scale"] else ""
            out.append(f"  {key[:-1]:6} {t['name']}: {t['dtype']} {t['shape']}{q}")
    out.append("ops: " + ", ".join(f"{name} x{n} (v{','.join(map(str, r['op_versions'][name]))})"
                                   for name, n in r["ops"]["histogram"].items()))
    out.append(f"op dtypes: {_share(r['op_dtype_share'])}")
    out.append(f"weights: {_share(r['weight_share'])} of {_size(sum(r['weight_bytes'].values()))}")
    q = r["quantization"]
    if q["quantized"]:
        out.append(f"quantized tensors: {q.get('per_channel', 0)} per-channel, {q.get('per_tensor', 0)} per-tensor")
        if r["float_ops"]:
            out.append(f"ops computing in float32: {len(r['float_ops'])} ("
                       + ", ".join(f"#{o['index']} {o['op']}" for o in r["float_ops"][:12])
                       + (", ..." if len(r["float_ops"]) > 12 else "") + ")")
    sp = r["sparsity"]
    out.append(f"kernel sparsity: {100 * sp['zero_fraction']:.2f}% zeros over {sp['weights_counted']} weights"
               + (f", {sp['sparse_format_tensors']} tensors in sparse format" if sp["sparse_format_tensors"] else ""))
    if r["custom_ops"] or r["flex_ops"]:
        out.append(f"custom ops: {', '.join(r['custom_ops']) or '-'}; flex ops: {', '.join(r['flex_ops']) or '-'}")
    meta = r["metadata"]
    out.append(f"metadata: {', '.join(meta['entries']) or '-'}; converter's min runtime version "
               f"{meta['min_runtime_version'] or '-'}")
    standard = meta.get("tflite")
    if standard and "error" not in standard:
        out.append(f"TFLite Metadata: {standard.get('name') or '-'} (parser >= {standard.get('min_parser_version')})"
                   + "".join(f"; {kind} " + ", ".join(_standard_tensor(t) for t in standard[kind])
                             for kind in ("inputs", "outputs") if standard[kind]))
    elif standard:
        out.append(f"TFLite Metadata: {standard['error']}")
    if r.get("runtime_requirements"):
        req = r["runtime_requirements"]
        if req["min_version"]:
            out.append(f"needs a TFLite runtime >= {req['min_version']} (from the op versions: "
                       + ", ".join(f"{o['op']} v{o['version']} >= {o['min_version']}" for o in req["limiting_ops"])
                       + ")" + (", and:" if req["unknown_ops"] else ""))
        out.extend(f"  {reason}" for reason in req.get("unknown_reasons", []))
    ek = meta["edgekit"]
    if ek:
        out.append(f"edgekit: mode {ek.get('mode')}, io {ek.get('io')}, labels {len(ek.get('labels') or [])}, "
                   f"source {ek.get('source', {}).get('file')}")
        if ek.get("delegates"):
            out.append("delegate hints: " + " -> ".join(d["accelerator"] for d in ek["delegates"]))
    out.extend(_accelerator_lines(r, name))
    for check in r.get("runtime_checks", []):
        verdict = "loads" if check["ok"] else "FAILS to load"
        out.append(f"runtime {check['runtime']} (TFLite {check['tflite_version']}): {verdict}")
        out.extend(f"  {o['op']} version {o['version']} needs TFLite >= {o['min_version']}" for o in check["unsupported"])
        out.extend(f"  {reason}" for reason in check.get("unknown_reasons", []))
    return "\n".join(out)


def _standard_tensor(t: dict) -> str:
    """One tensor of the standard TFLite Metadata, as inspect prints it: name (content, normalisation, files)."""
    said = [t.get("content") or "-"]
    said += [str(t[k]) for k in ("color_space", "sample_rate") if t.get(k) is not None]
    norm = t.get("normalization")
    if norm:
        said.append(f"mean {norm.get('mean')} std {norm.get('std')}")
    said += [f"{f['name']}: {f['lines']} {f['type'].lower().replace('_', ' ')}" for f in t.get("files") or []]
    return f"{t.get('name')} ({', '.join(said)})"

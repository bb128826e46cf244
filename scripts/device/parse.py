#!/usr/bin/env python3
"""Reads the outputs of the device check's steps (scripts/device/check.sh) and judges them.

Every judging subcommand prints one line, `STATUS<TAB>figures`, STATUS being PASS, FAIL or BELOW-GOAL; other
subcommands print what they say. Only the standard library: it runs wherever check.sh does.
"""

import json
import math
import re
import sys

TOLERANCE = 1e-4  # relative, per-iteration loss (cuDNN is not bit-deterministic across runs)


def json_lines(path):
    """Every line of the file that is a JSON object (logs and metrics mixed)."""
    rows = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("{") and line.endswith("}"):
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return rows


def verdict(ok, figures, status_if_bad="FAIL"):
    print(f"{'PASS' if ok else status_if_bad}\t{figures}")


def parse_size(text):
    m = re.fullmatch(r"(\d+)\s*([KMG]?)B?", text.strip().upper())
    if not m:
        raise SystemExit(f"bad size {text!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def human(n):
    for unit, shift in (("GB", 30), ("MB", 20), ("KB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def flatten(value, prefix=""):
    """{"a": {"b": 1}} -> {"a.b": 1}; lists kept whole (and their items flattened as a.0.b)."""
    out = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(value, list):
        out[prefix[:-1]] = value
        for i, v in enumerate(value):
            if isinstance(v, (dict, list)):
                out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = value
    return out


def find(flat, *patterns):
    """The first value whose dotted key matches one of the patterns (in order)."""
    for pattern in patterns:
        for key, value in flat.items():
            if re.search(pattern, key, re.IGNORECASE):
                return value
    return None


def gpu_name(device):
    if not isinstance(device, dict):
        return str(device)
    memory = device.get("memory_bytes")
    return f"{device.get('name', '?')}{f' {memory / 2**30:.0f} GiB' if isinstance(memory, (int, float)) else ''}"


def cmd_doctor(path):
    """`ringtrain doctor --json`: one JSON document (possibly pretty-printed)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        verdict(False, f"no JSON from doctor --json ({e})")
        return
    flat = flatten(doc)
    cuda = find(flat, r"^cuda\.available$", r"cuda_available", r"cuda.*avail")
    count = find(flat, r"cuda\.devices$", r"^devices$", r"device_count", r"gpus?$")
    if isinstance(count, list):
        names = [gpu_name(d) for d in count]
        count = f"{len(names)} ({', '.join(names)})"
    nccl_ok = find(flat, r"nccl.*(loadable|loaded|available)", r"^nccl$")
    nccl_version = find(flat, r"nccl.*version")
    figures = (
        f"libtorch {find(flat, r'libtorch.*version', r'torch.*version', r'^libtorch$')} "
        f"(cuda build {find(flat, r'cuda_build')}), "
        f"cuda {cuda}, devices {count}, cudnn {find(flat, r'cudnn')}, "
        f"nccl {nccl_version if nccl_version is not None else nccl_ok}, "
        f"cpu threads {find(flat, r'threads', r'cpus?$')}"
    )
    verdict(cuda is True and (nccl_ok is True or bool(nccl_version)), figures)


def cmd_allreduce(path, world, sizes):
    """`bench allreduce --json`: every expected size measured, every sum exact."""
    rows = [r for r in json_lines(path) if r.get("bench") == "allreduce"]
    rows = [r for r in rows if int(r.get("world", world)) == int(world)]
    wanted = [parse_size(s) for s in sizes.split(",")]
    seen = {}
    for r in rows:
        n = int(r.get("bytes", r.get("size_bytes", -1)))
        seen.setdefault(n, []).append(r)
    problems, figures = [], []
    for n in wanted:
        if n not in seen:
            problems.append(f"{human(n)} missing")
            continue
        r = seen[n][0]
        ms = r.get("ms", 1e3 * r["seconds"] if "seconds" in r else float("nan"))
        exact = all(x.get("exact") is True for x in seen[n])
        if not exact:
            problems.append(f"{human(n)} not exact")
        figures.append(
            f"{human(n)}: {ms:.3f} ms, algbw {r.get('algbw_gbps', float('nan')):.2f}, "
            f"busbw {r.get('busbw_gbps', float('nan')):.2f} GB/s{'' if exact else ' NOT EXACT'}"
        )
    text = "; ".join(figures) if figures else "no allreduce lines"
    verdict(not problems, text if not problems else f"{', '.join(problems)}; {text}")


def losses(path):
    """{iteration: loss} from rank 0's iteration lines."""
    out = {}
    for r in json_lines(path):
        if r.get("kind") == "iteration" and r.get("rank", 0) == 0:
            out[int(r["iteration"])] = float(r["loss"])
    return out


def test_error(path):
    epochs = [r for r in json_lines(path) if r.get("kind") == "epoch" and r.get("rank", 0) == 0]
    return epochs[-1].get("test_error") if epochs else None


def max_relative(a, b):
    common = sorted(set(a) & set(b))
    worst, at = 0.0, common[0] if common else None
    for i in common:
        d = abs(a[i] - b[i]) / max(abs(b[i]), 1e-12)
        if not math.isfinite(d) or d > worst:
            worst, at = d, i
    return worst, at, len(common)


def cmd_equivalence(nccl, virtual, ring):
    """Per-iteration loss of NCCL k=2 and the ring k=2 against --virtual-ranks 2."""
    ref = losses(virtual)
    ok, parts = bool(ref), []
    if not ref:
        parts.append("no iteration lines from --virtual-ranks 2")
    for name, path in (("nccl", nccl), ("ring", ring)):
        got = losses(path)
        if not got:
            ok = False
            parts.append(f"{name}: no iteration lines")
            continue
        worst, at, n = max_relative(got, ref)
        if n != len(ref) or n != len(got):
            ok = False
        if not worst <= TOLERANCE:
            ok = False
        parts.append(f"{name} vs virtual: max rel diff {worst:.2e} (iteration {at}, {n} iterations compared)")
    errors = ", ".join(f"{k} {test_error(p)}" for k, p in (("nccl", nccl), ("virtual", virtual), ("ring", ring)))
    parts.append(f"final test error: {errors}")
    verdict(ok, "; ".join(parts))


def cmd_pipeline(resnet_split, resnet_unsplit, composite_split, composite_unsplit):
    """Per-iteration loss of the pipelined runs against their unsplit runs."""
    ok, parts = True, []
    runs = (("resnet20", resnet_split, resnet_unsplit), ("composite", composite_split, composite_unsplit))
    for name, split, unsplit in runs:
        got, ref = losses(split), losses(unsplit)
        if not got or not ref:
            ok = False
            parts.append(f"{name}: no iteration lines ({len(got)} split, {len(ref)} unsplit)")
            continue
        worst, at, n = max_relative(got, ref)
        if n != len(ref) or n != len(got) or not worst <= TOLERANCE:
            ok = False
        parts.append(f"{name} 2 stages vs unsplit: max rel diff {worst:.2e} (iteration {at}, {n} iterations)")
    verdict(ok, "; ".join(parts))


def bench_train_row(path, world):
    rows = [r for r in json_lines(path) if r.get("bench") == "train" and int(r.get("world", -1)) == int(world)]
    return rows[-1] if rows else None


def cmd_bench_train(path, world):
    """Prints `samples_per_s<TAB>step_ms<TAB>phases` of the world-k row, or nothing."""
    r = bench_train_row(path, world)
    if r is None:
        return
    phases = ", ".join(
        f"{k[:-3]} {r[k]:.1f}" for k in ("forward_ms", "backward_ms", "allreduce_ms", "optimizer_ms") if k in r
    )
    print(f"{r.get('samples_per_s', float('nan')):.1f}\t{r.get('step_ms', float('nan')):.2f}\t{phases}")


def cmd_eager(path):
    """Prints samples_per_s of resnet50_eager.py's line, or nothing."""
    rows = [r for r in json_lines(path) if r.get("impl") == "pytorch-eager"]
    if rows:
        print(f"{rows[-1]['samples_per_s']:.1f}")


def cmd_share(path, world):
    r = bench_train_row(path, world)
    if r is None:
        verdict(False, f"no world-{world} row")
        return
    step, allreduce = r.get("step_ms"), r.get("allreduce_ms")
    if not step or allreduce is None:
        verdict(False, f"row without step_ms/allreduce_ms: {r}")
        return
    verdict(
        True,
        f"all-reduce {allreduce:.1f} of {step:.1f} ms per step = {100 * allreduce / step:.1f}% "
        f"({r.get('samples_per_s', float('nan')):.0f} img/s at k={world}, batch {r.get('batch')} per rank)",
    )


def cmd_job(path):
    """Prints `state<TAB>summary` of a GET /v1/jobs/{id} answer."""
    try:
        with open(path) as f:
            job = json.load(f)
    except (OSError, ValueError):
        print("unknown\tno job JSON")
        return
    r = job.get("result") or {}
    bits = []
    if r:
        bits.append(f"final test error {r.get('final_test_error')}, {r.get('samples_per_s', 0):.0f} samples/s")
    if job.get("error"):
        bits.append(f"error: {job['error']}")
    bits.append(f"attempt {job.get('attempt')}")
    print(f"{job.get('state', 'unknown')}\t{'; '.join(bits)}")


def cmd_nodes(path):
    """A one-line summary of GET /v1/nodes (the devices the local agent registered)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        print("no nodes JSON")
        return
    nodes = doc.get("nodes", doc.get("items", doc)) if isinstance(doc, dict) else doc
    parts = []
    for node in nodes if isinstance(nodes, list) else []:
        devices = node.get("devices", []) if isinstance(node, dict) else []
        names = [
            " ".join(str(d.get(k)) for k in ("kind", "name", "memory_mb", "memory_bytes") if d.get(k) is not None)
            for d in devices
            if isinstance(d, dict)
        ]
        parts.append(f"{node.get('name', '?')}: {len(devices)} devices ({'; '.join(names)})")
    print(" | ".join(parts) if parts else "no nodes")


def cmd_table(path):
    """The results TSV (step, status, seconds, figures) as a markdown table."""
    print("| step | result | s | figures |")
    print("|---|---|---|---|")
    with open(path, errors="replace") as f:
        for line in f:
            step, status, seconds, figures = (line.rstrip("\n").split("\t") + ["", "", "", ""])[:4]
            figures = figures.replace("|", "\\|")
            print(f"| {step} | {status} | {seconds} | {figures} |")


def cmd_resnet_table(path):
    """precision, batch, ringtrain img/s, PyTorch img/s, ratio, goal, phases -> markdown."""
    print("| precision | batch | ringtrain img/s | PyTorch eager img/s | ratio | goal | ringtrain ms per step (phases) |")
    print("|---|---|---|---|---|---|---|")
    with open(path, errors="replace") as f:
        for line in f:
            p, b, rt, py, ratio, goal, phases = (line.rstrip("\n").split("\t") + [""] * 7)[:7]
            print(f"| {p} | {b} | {rt} | {py} | {ratio} | {goal} | {phases} |")


def main():
    commands = {
        "doctor": cmd_doctor,
        "allreduce": cmd_allreduce,
        "equivalence": cmd_equivalence,
        "pipeline": cmd_pipeline,
        "bench-train": cmd_bench_train,
        "eager": cmd_eager,
        "share": cmd_share,
        "job": cmd_job,
        "nodes": cmd_nodes,
        "table": cmd_table,
        "resnet-table": cmd_resnet_table,
    }
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        raise SystemExit(f"usage: parse.py {{{','.join(commands)}}} ARGS...")
    commands[sys.argv[1]](*sys.argv[2:])


if __name__ == "__main__":
    main()

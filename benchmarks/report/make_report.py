#!/usr/bin/env python3
"""Writes docs/benchmarks.md from the page's text (benchmarks.md.in) and the logs of one
benchmarks/run.sh run: the line `<!-- side-by-side tables -->` of the template is replaced by the
tables of the run. Standard library only.

  make_report.py --results DIR --template FILE --out FILE
"""
import argparse
import os
import re

MARKER = "<!-- side-by-side tables -->"
STEP_WIDTHS = {"S": ([784, 128, 10], 64), "M": ([784, 512, 512, 10], 256), "L": ([1024, 4096, 4096, 1024], 512)}
MAIN_WIDTHS = [784, 512, 256, 10]


def dense_step_flops(widths):
    """GEMM flops per sample of a training step of a dense stack, as bench_step counts them:
    forward and weight gradient for every layer, input gradient for every layer but the first."""
    f = 0
    for i in range(len(widths) - 1):
        mac = widths[i] * widths[i + 1]
        f += 2 * mac * (3 if i > 0 else 2)
    return f


def cnn_step_flops():
    """Flops per sample of the CNN's step: conv1 forward + weight gradient (it computes no input
    gradient), conv2 forward + both gradients, the dense layers as dense_step_flops."""
    conv1 = 2 * 28 * 28 * 32 * 1 * 25
    conv2 = 2 * 14 * 14 * 64 * 32 * 25
    return 2 * conv1 + 3 * conv2 + 3 * 2 * (3136 * 1024 + 1024 * 10)


class Run:
    def __init__(self, d):
        self.d = d
        self.cmds = {}
        path = os.path.join(d, "commands.tsv")
        if os.path.exists(path):
            for line in open(path):
                name, rc, wall, cmd = line.rstrip("\n").split("\t", 3)
                self.cmds[name] = (int(rc), float(wall), cmd)
        self.machine = self.kv_file("machine.txt")
        self.peers = {}
        path = os.path.join(d, "peers.status")
        if os.path.exists(path):
            for line in open(path):
                kv = self.tokens(line)
                if "peer" in kv:
                    self.peers[kv["peer"]] = kv

    @staticmethod
    def tokens(line):
        kv = {}
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                kv[k] = v
        return kv

    def kv_file(self, name):
        kv = {}
        path = os.path.join(self.d, name)
        if os.path.exists(path):
            for line in open(path):
                if "=" in line:
                    k, v = line.rstrip("\n").split("=", 1)
                    kv[k] = v
        return kv

    def lines(self, name):
        path = os.path.join(self.d, name + ".log")
        if not os.path.exists(path):
            return []
        return [self.tokens(l) for l in open(path, errors="replace") if "=" in l]

    def find(self, name, key, **match):
        """The float value of `key` on the first line of NAME's log whose tokens match."""
        for kv in self.lines(name):
            if key in kv and all(kv.get(k) == str(v) for k, v in match.items()):
                try:
                    return float(kv[key])
                except ValueError:
                    return None
        return None

    def why(self, name, peer=None):
        """Why NAME has no figure."""
        if peer:
            st = self.peers.get(peer) or self.peers.get("all")
            if st is None:
                return "not run"
            if st.get("status") != "ok":
                return "skipped: " + st.get("reason", "?").replace("_", " ")
        if name not in self.cmds:
            return "not run"
        rc = self.cmds[name][0]
        return f"failed (exit {rc})" if rc else "no result line"


def fmt(x, digits=0):
    if x is None:
        return None
    if digits == 0:
        return f"{x:,.0f}".replace(",", " ")
    return f"{x:.{digits}f}"


def ratio(a, b, digits=2):
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.{digits}f}×"


def cell(run, value, name, peer=None, digits=0):
    s = fmt(value, digits)
    return s if s is not None else f"— ({run.why(name, peer)})"


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def machine_section(run, peak):
    m = run.machine
    flags = set(m.get("flags", "").split(","))
    host_gemm, core = "unknown", None
    path = os.path.join(run.d, "ours_step.log")
    for line in open(path, errors="replace") if os.path.exists(path) else []:
        if line.startswith("host_gemm="):
            host_gemm = line.strip().split("=", 1)[1]
        core = core or run.tokens(line).get("openblas_core")
    peers = ", ".join(
        f"{p} {kv.get('version', '')} ({kv.get('how', '')})" if kv.get("status") == "ok"
        else f"{p}: {kv.get('reason', 'skipped').replace('_', ' ')}" for p, kv in run.peers.items())
    vec = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "AVX" if "avx" in flags else "SSE"
    lines = [
        f"- CPU: {m.get('cpu_model', '?').replace('_', ' ')}, {m.get('cpus', '?')} logical CPUs, widest vectors {vec}"
        f"{', FMA' if 'fma' in flags else ''}; compiler {m.get('compiler', '?').replace('_', ' ')}.",
        f"- lockstep's host GEMM: `{host_gemm}`; OpenBLAS {m.get('openblas_package', '?')} kernel set in use "
        f"`{core or '?'}` (its own choice here: `{m.get('openblas_auto_core', '?')}`"
        + (f"; every program of the run had `OPENBLAS_CORETYPE={m['openblas_coretype']}`)." if m.get("openblas_coretype")
           else ")."),
        f"- Peers: {peers or 'none'}.",
        f"- FMA peak of one core: {peak['text']}.",
        f"- Run: {'--quick (figures meaningless: few repeats, 1 epoch)' if m.get('quick') == '1' else 'full'}, "
        f"{int(m.get('total_s', 0)) // 60} min {int(m.get('total_s', 0)) % 60} s.",
    ]
    return "\n".join(lines)


def fma_peak(run):
    """The FMA peak of one core: measured by bench_fma when it ran, else computed from the clock."""
    m = run.machine
    flags = set(m.get("flags", "").split(","))
    mhz_src = "`lscpu` CPU max MHz"
    try:
        mhz = float(m.get("lscpu_max_mhz") or "nan")
    except ValueError:
        mhz = float("nan")
    if not mhz == mhz:
        mhz_src = "/proc/cpuinfo `cpu MHz`; lscpu reports no max MHz here"
        try:
            mhz = float(m.get("cpu_mhz") or 0)
        except ValueError:
            mhz = 0
    lanes = 16 if "avx512f" in flags else 8 if "avx" in flags else 4
    units = 2 if "fma" in flags or "avx512f" in flags else 1
    per_cycle = lanes * 2 * units
    computed = mhz / 1000 * per_cycle
    computed_text = (
        f"{computed:.1f} GFLOP/s = {mhz:.0f} MHz ({mhz_src}) × {lanes} float lanes × 2 flops per FMA × {units} FMA "
        f"unit{'s' if units > 1 else ''} per core (the unit count is assumed: the CPU flags do not tell it)")
    measured = run.find("ours_fma", "fma_peak_gflops")
    if measured:
        implied = measured * 1000 / per_cycle
        return {"gflops": measured, "text": (
            f"{measured:.1f} GFLOP/s measured (`bench_fma`: independent chains of {lanes}-lane FMAs on one core), "
            f"i.e. the core ran at {implied:.0f} MHz × {lanes} lanes × 2 flops × {units} FMA units; computed from the "
            f"nominal clock instead: {computed_text}")}
    return {"gflops": computed or None, "text": computed_text + " (bench_fma did not run)"}


def best_sgemm(run):
    best, where = None, ""
    for kv in run.lines("ours_gemm"):
        if "shape" not in kv:
            continue
        m, n, k = (int(x) for x in kv["shape"].split("x"))
        flops = 2.0 * m * n * k
        cands = {"OpenBLAS cblas_sgemm": kv.get("openblas_gflops"), f"lockstep gemm": kv.get("lockstep_gflops")}
        if "dnnl_sgemm_us" in kv:
            cands["oneDNN dnnl_sgemm"] = flops / float(kv["dnnl_sgemm_us"]) / 1e3
        for what, v in cands.items():
            if v is not None and (best is None or float(v) > best):
                best, where = float(v), f"{what} at {kv['shape']}"
    return best, where


def step_section(run, peak, sgemm, sgemm_where):
    rows = []
    for c in ["S", "M", "L", "cnn"]:
        if c == "cnn":
            ours = run.find("ours_conv", "samples_per_s", config="cnn", replicas=1)
            ceiling, fps, oname, desc = None, cnn_step_flops(), "ours_conv", "CNN (`--model cnn`), batch 64, Adam"
        else:
            ours = run.find("ours_step", "samples_per_s", config=c)
            ceiling = run.find("ours_step", "gemm_ceiling_samples_per_s", config=c)
            widths, batch = STEP_WIDTHS[c]
            fps, oname = dense_step_flops(widths), "ours_step"
            desc = f"{c}: {'-'.join(map(str, widths))}, batch {batch}, SGD"
        tf = run.find(f"tf_step_{c}", "samples_per_s")
        pt = run.find(f"torch_step_{c}", "samples_per_s")
        lim_sgemm = sgemm * 1e9 / fps if sgemm else None
        lim_fma = peak["gflops"] * 1e9 / fps if peak["gflops"] else None
        best_peer = max([x for x in (tf, pt) if x is not None], default=None)
        goal = ("≥ 2× best peer" if c == "S" else "≥ 1.0× best peer") + ("; ≥ 0.9 of fastest SGEMM" if c != "cnn" else "")
        rows.append([desc, cell(run, ours, oname), cell(run, tf, f"tf_step_{c}", "tensorflow"),
                     cell(run, pt, f"torch_step_{c}", "pytorch"), ratio(ours, tf), ratio(ours, pt), ratio(ours, best_peer),
                     f"{fmt(ceiling) or '—'} ({ratio(ours, ceiling)})",
                     f"{fmt(lim_sgemm) or '—'} ({ratio(ours, lim_sgemm)})", f"{fmt(lim_fma) or '—'} ({ratio(ours, lim_fma)})",
                     goal])
    head = ["config", "lockstep", "TensorFlow", "PyTorch", "ours/TF", "ours/PyTorch", "ours/best peer",
            "GEMM ceiling (ours/it)", "fastest SGEMM (ours/it)", "FMA peak (ours/it)", "goal"]
    text = (f"Samples/s of one training step on one core, one thread (bench_step, bench_conv `--only-step`, "
            f"`tf_bench.py step`, `torch_bench.py step`). The limits are samples/s: the GEMM ceiling is bench_step's "
            f"(the step's own GEMMs alone, with lockstep's kernels at the step's shapes; none for the CNN); "
            f"\"fastest SGEMM\" is the step's flops per sample at the fastest SGEMM rate of this run, "
            f"{fmt(sgemm, 1) or '—'} GFLOP/s ({sgemm_where or 'not measured'}; bench_gemm); \"FMA peak\" the same at the "
            f"FMA peak line. Flops per sample: S {dense_step_flops(STEP_WIDTHS['S'][0]) / 1e6:.2f} M, "
            f"M {dense_step_flops(STEP_WIDTHS['M'][0]) / 1e6:.2f} M, L {dense_step_flops(STEP_WIDTHS['L'][0]) / 1e6:.1f} M, "
            f"CNN {cnn_step_flops() / 1e6:.1f} M (convolutions and dense layers; conv1 computes no input gradient).")
    return text + "\n\n" + table(head, rows)


def precision_section(run):
    """mixed<bf16> against fp32 (bench_step's and bench_conv's precision lines, wall time) beside
    PyTorch's autocast and Keras's mixed_bfloat16 (tf_bench.py / torch_bench.py step --precision bf16)."""
    rows = []
    for c in ["S", "M", "L", "cnn"]:
        if c == "cnn":
            oname, desc = "ours_conv", "CNN, batch 64, Adam"
            fp = run.find(oname, "samples_per_s", config="cnn", replicas=1, precision="fp32")
            bf = run.find(oname, "samples_per_s", config="cnn", replicas=1, precision="bf16")
        else:
            oname = "ours_step"
            widths, batch = STEP_WIDTHS[c]
            desc = f"{c}: {'-'.join(map(str, widths))}, batch {batch}, SGD"
            fp = run.find(oname, "samples_per_s", config=c, precision="fp32")
            bf = run.find(oname, "samples_per_s", config=c, precision="bf16")
        tf = run.find(f"tf_step_{c}_bf16", "samples_per_s")
        pt = run.find(f"torch_step_{c}_bf16", "samples_per_s")
        best_peer = max([x for x in (tf, pt) if x is not None], default=None)
        goal = {"L": "≥ 1.7× fp32; ≥ 1.0× best peer", "cnn": "≥ 1.0× best peer"}.get(c, "—")
        rows.append([desc, cell(run, fp, oname), cell(run, bf, oname), ratio(bf, fp),
                     cell(run, tf, f"tf_step_{c}_bf16", "tensorflow"), cell(run, pt, f"torch_step_{c}_bf16", "pytorch"),
                     ratio(bf, best_peer), goal])
    head = ["config", "lockstep fp32", "lockstep bf16", "bf16/fp32", "TensorFlow bf16", "PyTorch bf16",
            "ours bf16/best peer bf16", "goal"]
    kernels = next((kv.get("kernels") for kv in run.lines("ours_step") if kv.get("precision") == "bf16"), None)
    text = ("Samples/s of one training step on one core under `mixed<bf16>` and fp32 (bench_step's and bench_conv's "
            "`precision=` lines: the step through `one_device<cpu<0>>`, wall time, both policies in interleaved "
            f"repeats; lockstep's bf16 GEMM kernels: {kernels or 'not reported'}), beside PyTorch's "
            "`torch.autocast(\"cpu\", dtype=torch.bfloat16)` and Keras's `mixed_bfloat16` policy over the same "
            "models and thread settings (`torch_bench.py step --precision bf16`, `tf_bench.py step --precision bf16`).")
    return text + "\n\n" + table(head, rows)


def scaling_section(run):
    o1 = run.find("ours_scaling", "samples_per_s", replicas=1)
    o2 = run.find("ours_scaling", "samples_per_s", replicas=2)
    o2s = run.find("ours_scaling", "samples_per_s", replicas=2, shard_optimizer=1)
    oi = run.find("ours_scaling", "samples_per_s", independent=2)
    m1 = run.find("ours_scaling_mpi", "samples_per_s", replicas=1)
    m2 = run.find("ours_scaling_mpi", "samples_per_s", workers=2)
    t1, t2 = run.find("tf_mirrored_1", "samples_per_s"), run.find("tf_mirrored_2", "samples_per_s")
    p1, p2 = run.find("torch_ddp_1", "samples_per_s"), run.find("torch_ddp_2", "samples_per_s")
    rows = []
    for what, a, b, na, nb, peer in [
            ("lockstep `mirrored<cpu<0>, cpu<1>>` (threads), `shard_optimizer = false`", o1, o2, "ours_scaling",
             "ours_scaling", None),
            ("the same with `shard_optimizer` (the default for SGD with momentum)", o1, o2s, "ours_scaling",
             "ours_scaling", None),
            ("limit: 2 one-device trainings of half the batch each, at once, exchanging nothing", o1, oi,
             "ours_scaling", "ours_scaling", None),
            ("lockstep `multi_worker_mirrored`, `mpirun -np 2`", m1, m2, "ours_scaling_mpi", "ours_scaling_mpi", None),
            ("TensorFlow MirroredStrategy, 2 logical CPUs, tf.data", t1, t2, "tf_mirrored_1", "tf_mirrored_2", "tensorflow"),
            ("PyTorch DDP, gloo, 2 processes", p1, p2, "torch_ddp_1", "torch_ddp_2", "pytorch")]:
        sp = b / a if a and b else None
        rows.append([what, cell(run, a, na, peer), cell(run, b, nb, peer), fmt(sp, 2) or "—",
                     ratio(o2s or o2, b) if peer else "—", ratio(sp, 2.0) if sp else "—"])
    head = ["system", "1 replica, samples/s", "2 replicas, samples/s", "speedup",
            "lockstep threads (2 replicas, the default) / it", "speedup / 2 (limit: linear scaling)"]
    text = ("Config M (784-512-512-10, ReLU) at global batch 256, SGD with momentum, one thread per replica; each "
            "system's one-replica figure is measured in the same run (bench_scaling; `tf_bench.py mirrored --replicas 1|2`; "
            "`torch_bench.py ddp --replicas 1|2`). The limit row (bench_scaling's `independent=2`) trains two one-device "
            "models at once on threads pinned to the two cores, each on half of the global batch with nothing exchanged: "
            "the speedup that the cores, their shared caches and memory allow before any communication. Goals: "
            "lockstep's speedup ≥ 1.7, and its 2-replica rate ≥ 1.5× TensorFlow's MirroredStrategy and ≥ 1.5× PyTorch DDP.")
    return text + "\n\n" + table(head, rows)


def allreduce_section(run):
    rows = []
    for mib in (16, 64):
        size = mib << 20
        th = run.find("ours_allreduce", "busbw_gb_per_s", replicas=2, allreduce_bytes=size)
        mc = run.find("ours_allreduce", "memcpy_gb_per_s", replicas=2, allreduce_bytes=size)
        pr = run.find("ours_allreduce_mpi", "busbw_gb_per_s", workers=2, allreduce_bytes=size)
        mpi = run.find("ours_allreduce_mpi", "mpi_allreduce_busbw_gb_per_s", workers=2, allreduce_bytes=size)
        gl = run.find(f"torch_allreduce_{mib}", "busbw_gb_per_s")
        rows.append([f"{mib} MiB", cell(run, th, "ours_allreduce", None, 2), cell(run, pr, "ours_allreduce_mpi", None, 2),
                     cell(run, mpi, "ours_allreduce_mpi", None, 2), cell(run, gl, f"torch_allreduce_{mib}", "pytorch", 2),
                     ratio(th, gl), ratio(pr, gl), ratio(pr, mpi), cell(run, mc, "ours_allreduce", None, 2),
                     ratio(th, mc), ratio(pr, mc)])
    head = ["size", "lockstep, 2 threads", "lockstep, 2 processes", "MPI_Allreduce, 2 processes", "gloo, 2 processes",
            "threads / gloo", "processes / gloo", "processes / MPI", "memcpy", "threads / memcpy", "processes / memcpy"]
    text = ("busbw in GB/s (= algbw for 2 participants) of an all-reduce of floats between 2 replicas: lockstep's "
            "`host_allreduce` between threads (bench_allreduce), lockstep's multi-worker reduction between 2 processes "
            "and Open MPI's `MPI_Allreduce` in the same job (`mpirun -np 2 bench_allreduce`), torch.distributed's "
            "`all_reduce` over gloo (`torch_bench.py allreduce`); the limit is bench_allreduce's single-thread memcpy of "
            "the same size. Goal: ≥ 3× gloo.")
    return text + "\n\n" + table(head, rows)


def pipeline_section(run):
    o = run.find("ours_pipeline", "pipeline_samples_per_s")
    og = run.find("ours_pipeline", "pipeline_gb_per_s")
    mc = run.find("ours_pipeline", "memcpy_gb_per_s")
    t = run.find("tf_pipeline", "samples_per_s")
    tg = run.find("tf_pipeline", "gb_per_s")
    rows = [["lockstep (bench_pipeline)", cell(run, o, "ours_pipeline"), cell(run, og, "ours_pipeline", None, 3),
             "—", ratio(og, mc)],
            ["tf.data (`tf_bench.py pipeline`)", cell(run, t, "tf_pipeline", "tensorflow"),
             cell(run, tg, "tf_pipeline", "tensorflow", 3), ratio(o, t), ratio(tg, mc)]]
    head = ["pipeline", "samples/s", "sample GB/s", "lockstep / it", "GB/s / memcpy"]
    text = (f"The Fashion-MNIST training set decoded once (not timed), then ×1/255, shuffle(60000), batches of 256 "
            f"(lockstep also cuts each batch into 2 shards and prefetches 2; tf.data maps the scaling over whole "
            f"batches and prefetches 2, on a private pool of 2 threads), several epochs after a warm-up. Sample bytes: "
            f"784 floats and a label. memcpy (bench_pipeline, 128 MiB): {fmt(mc, 2) or '—'} GB/s. Goal: ≥ 2× tf.data.")
    return text + "\n\n" + table(head, rows)


def images_section(run):
    o = run.find("ours_images", "images_samples_per_s")
    t = run.find("tf_images", "images_samples_per_s")
    dec = run.find("ours_images", "images_decode_share")
    rd = run.find("ours_images", "images_read_share")
    st = run.find("ours_images", "images_stages_share")
    jpg = run.find("ours_images_write", "mean_bytes")
    rows = [["lockstep (`bench_images`)", cell(run, o, "ours_images"), "—"],
            ["tf.data (`tf_images.py`)", cell(run, t, "tf_images", "tensorflow"), ratio(o, t)]]
    text = ("JPEG decode + random resized crop to 224 × 224 + horizontal flip + per-channel normalisation, on one "
            f"thread, over 512 generated 224 × 224 JPEG files (quality 90, {fmt(jpg) or '?'} bytes on average) read "
            "from the page cache, batches of 64; both decode only the crop (lockstep: jpeg_crop_scanline and "
            "jpeg_skip_scanlines; tf.data: decode_and_crop_jpeg) with the accurate integer DCT. lockstep's time: "
            f"{fmt(100 * dec, 0) if dec is not None else '?'} % decoding, {fmt(100 * rd, 0) if rd is not None else '?'} % "
            f"reading, {fmt(100 * st, 0) if st is not None else '?'} % in the image stages. Goal: ≥ 1.5× tf.data per core.")
    scaling = []
    for w in (1, 2, 4):
        s = run.find("ours_images", "rank0_seconds", workers=w)
        r = run.find("ours_images", "seconds_ratio_to_one", workers=w)
        n = run.find("ours_images", "rank0_samples", workers=w)
        scaling.append([str(w), cell(run, n, "ours_images"), cell(run, s, "ours_images", None, 3), fmt(r, 3) or "—",
                        f"{1 / w:.3f}"])
    text2 = ("Work per worker: one epoch cut for rank 0 of W workers (one replica each), rank 0 decoding its rows only:")
    return (text + "\n\n" + table(["pipeline, one core", "samples/s", "lockstep / it"], rows) + "\n\n" + text2 + "\n\n" +
            table(["workers W", "rank 0's samples", "rank 0's seconds", "seconds / W = 1", "1 / W"], scaling))


def mainjob_section(run, peak, epochs):
    ow = run.cmds.get("ours_mainjob", (1, None, ""))[1] if run.cmds.get("ours_mainjob", (1,))[0] == 0 else None
    oa = run.find("ours_mainjob", "test_accuracy")
    sw = run.cmds.get("ours_mainjob_unsharded", (1, None, ""))[1] if run.cmds.get("ours_mainjob_unsharded", (1,))[0] == 0 else None
    systems = [("lockstep, 2 CPU replicas (`fashion_mnist`)", ow, oa, "ours_mainjob", None),
               ("the same with `--no-shard-optimizer` (AdamW's update not sharded)", sw,
                run.find("ours_mainjob_unsharded", "test_accuracy"), "ours_mainjob_unsharded", None),
               ("Keras fit, one device, 2 threads", run.find("tf_mainjob_one", "wall_s"),
                run.find("tf_mainjob_one", "test_accuracy"), "tf_mainjob_one", "tensorflow"),
               ("Keras fit, MirroredStrategy, 2 logical CPUs", run.find("tf_mainjob_mirrored", "wall_s"),
                run.find("tf_mainjob_mirrored", "test_accuracy"), "tf_mainjob_mirrored", "tensorflow"),
               ("PyTorch, one process, 2 threads", run.find("torch_mainjob", "wall_s"),
                run.find("torch_mainjob", "test_accuracy"), "torch_mainjob", "pytorch")]
    flops = dense_step_flops(MAIN_WIDTHS) * 60000 * epochs
    lim = flops / (2 * peak["gflops"] * 1e9) if peak["gflops"] else None
    rows = []
    for what, w, a, name, peer in systems:
        rows.append([what, cell(run, w, name, peer, 1), cell(run, a, name, peer, 4),
                     ratio(w, ow) if peer else "—",
                     f"{(oa - a) * 100:+.2f}" if peer and a is not None and oa is not None else "—",
                     ratio(lim, w)])
    keras = [w for _, w, _, _, p in systems[2:4] if w is not None]
    text = (f"From the gz files to the test accuracy: read, decode, shuffle, batch, train {epochs} epochs of "
            f"784-512-256-10 (ReLU, dropout 0.2) with AdamW (lr 1e-3, weight decay 0.02) and cosine decay to 0, "
            f"global batch 128, then evaluate on the 10 000 test images. lockstep's time is the process's wall time; "
            f"the peers' start after the framework's import. The limit is the training's GEMM flops "
            f"({flops / 1e12:.2f} TFLOP) at the FMA peak of 2 cores: {fmt(lim, 1) or '—'} s. "
            f"Goal: ≥ 3× Keras fit in its fastest configuration "
            f"({'here ' + fmt(min(keras), 1) + ' s' if keras else 'not measured'}) at equal accuracy (±0.5 %).")
    head = ["system", "wall s", "test accuracy", "its time / lockstep's", "lockstep − it, accuracy points",
            "limit / its time"]
    return text + "\n\n" + table(head, rows)


def cnn_epoch_section(run):
    """One epoch of the tutorial CNN on both cores: lockstep's process wall time against Keras fit's."""
    ours = run.cmds.get("ours_cnn_epoch", (1, None, ""))
    ow = ours[1] if ours[0] == 0 else None
    oa = run.find("ours_cnn_epoch", "test_accuracy")
    kw, ka = run.find("tf_mainjob_cnn", "wall_s"), run.find("tf_mainjob_cnn", "test_accuracy")
    rows = [["lockstep, 2 CPU replicas (`fashion_mnist --model cnn --epochs 1 --batch 128`)", cell(run, ow, "ours_cnn_epoch", None, 1),
             cell(run, oa, "ours_cnn_epoch", None, 4), "—", "≥ 1.2× Keras fit"],
            ["Keras fit, one device, 2 threads (`tf_bench.py mainjob --model cnn --epochs 1`)",
             cell(run, kw, "tf_mainjob_cnn", "tensorflow", 1), cell(run, ka, "tf_mainjob_cnn", "tensorflow", 4),
             ratio(kw, ow), ""]]
    text = ("One epoch of the tutorial CNN (`--model cnn`: two 5 × 5 convolutions with ReLU and 2 × 2 max pooling, "
            "dense 3136-1024 with dropout 0.4, dense 1024-10), AdamW with cosine decay, global batch 128, from the gz "
            "files to the test accuracy, as the main job above.")
    return text + "\n\n" + table(["system", "wall s", "test accuracy", "its time / lockstep's", "goal"], rows)


def compile_section(run):
    def c(name, target, key):
        return run.find(name, key, target=target)
    rows = []
    for what, ours_t, dlib_t in [("the main job's MLP (lockstep: examples/fashion_mnist/main.cpp, 4 models; "
                                  "getting_started.cpp, 1 MLP)", "fashion_mnist", "dlib_mlp"),
                                 ("LeNet-size CNN (benchmarks/compile/lenet.cpp)", "lenet", "dlib_lenet")]:
        os_, om = c("ours_compile", ours_t, "compile_s"), c("ours_compile", ours_t, "peak_mib")
        ds, dm = c("dlib_compile", dlib_t, "compile_s"), c("dlib_compile", dlib_t, "peak_mib")
        extra = ""
        if ours_t == "fashion_mnist":
            gs = c("ours_compile", "getting_started", "compile_s")
            gm = c("ours_compile", "getting_started", "peak_mib")
            extra = f"; getting_started {fmt(gs, 2) or '—'} s / {fmt(gm) or '—'} MiB ({ratio(gs, ds)} / {ratio(gm, dm)})"
        rows.append([what, f"{cell(run, os_, 'ours_compile', None, 2)} s / {cell(run, om, 'ours_compile')} MiB{extra}",
                     f"{cell(run, ds, 'dlib_compile', 'dlib', 2)} s / {cell(run, dm, 'dlib_compile', 'dlib')} MiB",
                     f"{ratio(os_, ds)} / {ratio(om, dm)}", "≤ 0.5×"])
    text = ("One translation unit compiled alone with `-std=c++20 -O2 -fno-math-errno` under `/usr/bin/time -v`: wall "
            "seconds and peak resident MiB (benchmarks/compile_cost.sh; benchmarks/peers/dlib_compile_cost.sh on "
            "benchmarks/peers/dlib/mlp.cpp and lenet.cpp, the same networks trained with dlib's `dnn_trainer` and Adam).")
    head = ["program", "lockstep", "dlib", "lockstep / dlib (time / memory)", "goal"]
    return text + "\n\n" + table(head, rows)


def commands_section(run):
    rows = []
    for name, (rc, wall, cmd) in run.cmds.items():
        rows.append([name, str(rc), f"{wall:.1f}", "`" + cmd.replace("|", "\\|") + "`"])
    return ("Every command of the run, in order (run from the repository root; `mpirun` had "
            "`OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo` and the allow-run-as-root variables "
            "in its environment):\n\n" + table(["name", "exit", "wall s", "command"], rows))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--template", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    run = Run(a.results)
    peak = fma_peak(run)
    sgemm, where = best_sgemm(run)
    epochs = 1 if run.machine.get("quick") == "1" else 20
    parts = [
        "### Machine", machine_section(run, peak),
        "### Single-device training step", step_section(run, peak, sgemm, where),
        "### Mixed precision (bf16), one core", precision_section(run),
        "### Data parallelism, 2 replicas", scaling_section(run),
        "### Main job: Fashion-MNIST end to end", mainjob_section(run, peak, epochs),
        "### One CNN epoch", cnn_epoch_section(run),
        "### All-reduce between 2 replicas", allreduce_section(run),
        "### Input pipeline", pipeline_section(run),
        "### Image decode and augmentation, one core", images_section(run),
        "### Compile cost", compile_section(run),
        "### Commands", commands_section(run),
    ]
    generated = "\n\n".join(parts)
    text = open(a.template).read()
    if MARKER not in text:
        raise SystemExit(f"make_report.py: {a.template} has no line {MARKER}")
    with open(a.out, "w") as f:
        f.write(text.replace(MARKER, generated))


if __name__ == "__main__":
    main()

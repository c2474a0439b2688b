"""The ``cardseg`` command line: thin glue around the engine, plus the subcommands other installed
packages register under the ``cardseg.commands`` entry points (the training tools)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

from cardseg.base.argparsing import CommandLineParser, DefaultsHelpFormatter
from cardseg.base.errors import CardsegError
from cardseg.base.filekind import check_file_or_folder, kind_of
from cardseg.base.options import check_int_range, check_new_file, check_run_options
from cardseg.bundle.review_rules import REVIEW_MAP_HELP
from cardseg.plugins import plugin_commands, run_plugin
from cardseg.plugins import plugin_help as describe_plugin

BACKEND_HELP = (
    "what runs the networks: torch (a TorchScript program made from the bundle's networks on the first "
    "run, checked and cached like the ONNX model; CPU or CUDA), onnx (ONNX Runtime on the CPU, about 1.5x faster "
    "end to end, same segmentation up to float rounding; needs the [speed] extra; the model is exported "
    "from the bundle's weights on the first run and cached in $CARDSEG_CACHE_DIR or ~/.cache/cardseg), "
    "or auto: onnx on the CPU when the [speed] extra is installed, else torch "
    "(default: $CARDSEG_BACKEND, else auto)"
)


#: what ``cardseg synth`` writes: single-file formats SimpleITK writes, and the volume's limits
SYNTH_SUFFIXES = (".nii.gz", ".nii", ".nrrd", ".mha")
SYNTH_MAX_SLICES = 400  # 400 x 192 x 176 voxels stays under cardseg.io.limits.MAX_VOLUME_VOXELS
SYNTH_MAX_SEED = 2**32 - 1


def build_parser(plugin_help: bool = False, plugins: Optional[dict] = None) -> argparse.ArgumentParser:
    """The whole command line; ``plugins``: the plugin subcommands to list (None: look them up)."""
    from cardseg import __version__

    parser = CommandLineParser(prog="cardseg", description="Calibrated categorical-diffusion segmentation (CARD).")
    parser.add_argument("--version", action="version", version=f"cardseg {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    _add_segment_parser(sub)
    _add_batch_parser(sub)
    _add_bundle_parsers(sub)
    _add_synth_parser(sub)

    from cardseg.serve import add_serve_parser

    add_serve_parser(sub)
    for name, ep in sorted((plugin_commands() if plugins is None else plugins).items()):
        if name in sub.choices:
            continue
        p = sub.add_parser(name, help=describe_plugin(ep) if plugin_help else None, add_help=False)
        p.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _add_segment_parser(sub) -> None:
    """``cardseg segment``: one volume."""
    p = sub.add_parser(
        "segment",
        help="segment a volume and calibrate its confidence",
        formatter_class=DefaultsHelpFormatter,
        description="Segment INPUT into OUTDIR: labels, calibrated probabilities, disagreement and "
        "temperature maps, flagged regions and a report. Everything is checked before any "
        "work; bad input ends with one line and exit code 2, nothing written.",
    )
    p.add_argument(
        "input",
        metavar="INPUT",
        help="NIfTI (.nii/.nii.gz), NRRD, MetaImage (.mha/.mhd), a DICOM series folder, or a 2D "
        "PNG/JPEG/BMP/TIFF with --spacing; slices are the image's third axis",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="OUTDIR",
        required=True,
        help="output folder: new, empty, or one an earlier cardseg run wrote (with --overwrite)",
    )
    p.add_argument("--bundle", metavar="PATH", help="model bundle folder (default: $CARDSEG_BUNDLE or the shipped one)")
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="where the networks run; auto: CUDA when torch sees a GPU, else CPU",
    )
    p.add_argument("--batch-size", type=int, default=8, metavar="N", help="slices per network call")
    p.add_argument(
        "--method",
        default="card",
        choices=["card", "uc"],
        help="card: calibrated by trajectory agreement; uc: primary only, uncalibrated",
    )
    p.add_argument("--frame", type=int, metavar="N", help="frame (phase) of a 4D or cine DICOM image, 0-based")
    p.add_argument(
        "--spacing",
        metavar="SX,SY[,SZ]",
        help="pixel spacing in mm, replacing the file's (needed for PNG/JPEG/BMP/TIFF)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUTDIR if it holds only an earlier cardseg run's results (never anything else)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary line")
    p.add_argument(
        "--progress",
        default="bar",
        choices=["bar", "json", "none"],
        help="bar: a progress bar on stderr; json: one {stage, done, total} object per line on stderr; "
        "the summary line goes to stdout either way",
    )
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads of each network (default: the CPUs this process may use: its affinity mask, "
        "capped by the cgroup CPU quota); with ONNX Runtime and N >= 2 the reference runs beside "
        "the primary, each with N threads",
    )
    p.add_argument("--backend", choices=["auto", "torch", "onnx"], help=BACKEND_HELP)
    p.add_argument("--review-map", metavar="MAP", help=REVIEW_MAP_HELP)
    _add_eof_option(p)


def _add_eof_option(p) -> None:
    """``--eof``: what the end of standard input does to a ``segment`` or ``batch`` run."""
    p.add_argument(
        "--eof",
        default="finish",
        choices=["finish", "stop"],
        help="finish: standard input is not read; stop: the run stops at the end of its standard input "
        "(its starter, e.g. the Slicer module, is gone) as SIGTERM stops it, nothing half written",
    )


def _add_batch_parser(sub) -> None:
    """``cardseg batch``: many cases, in this process, local workers or on Ray."""
    p = sub.add_parser(
        "batch",
        help="segment many cases: cohort table, resume, triage report, optional Ray",
        formatter_class=DefaultsHelpFormatter,
        description="Segment every case into OUTDIR/<case>/ exactly as 'segment' does, with the model "
        "loaded once per worker; write cohort.csv (and cohort.parquet with pyarrow), "
        "subjects.csv (cardiac indices with intervals for subjects with ED and ES cases), "
        "curves.csv (the volume curves of cine inputs: see --frames) "
        "and triage.html. A bad case gets its one-line error in the table and the batch "
        "goes on (exit code 1 at the end); a rerun skips finished cases (keyed by the "
        "input's content and the bundle). Refusals before any work: one line, exit 2.",
    )
    p.add_argument(
        "inputs",
        nargs="*",
        metavar="INPUT",
        help="image files, folders (their image files and DICOM series sub-folders; a folder of DICOM "
        "files is one case) or glob patterns (quote them; ** recurses); or use --manifest",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="OUTDIR",
        required=True,
        help="batch folder: new, empty, or an earlier batch's (resumed); any other folder is refused",
    )
    p.add_argument(
        "--manifest",
        metavar="CSV",
        help="cases from a CSV with the header case,path,frame,phase,subject (case and path required; "
        "phase ED or ES; relative paths from the CSV's folder)",
    )
    p.add_argument(
        "--bundle", metavar="PATH", help="model bundle folder; without it: $CARDSEG_BUNDLE, else the shipped one"
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="where the networks run; auto: CUDA when torch sees a GPU, else CPU",
    )
    p.add_argument("--batch-size", type=int, default=8, metavar="N", help="slices per network call")
    p.add_argument(
        "--method",
        default="card",
        choices=["card", "uc"],
        help="card: calibrated by trajectory agreement; uc: primary only, uncalibrated",
    )
    _add_batch_frame_options(p)
    p.add_argument(
        "--spacing",
        metavar="SX,SY[,SZ]",
        help="pixel spacing in mm for every case, replacing the files' (needed for PNG/JPEG/BMP/TIFF)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="recompute every case, replacing the case folders cardseg wrote (never anything else); "
        "needed to reuse an OUTDIR made with another bundle or method",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary line")
    p.add_argument(
        "--progress",
        default="bar",
        choices=["bar", "json", "none"],
        help="bar: a progress bar over cases on stderr with ETA and cases/min; json: one "
        "{stage, done, total} object per line on stderr",
    )
    _add_eof_option(p)
    _add_batch_worker_options(p)


def _add_batch_frame_options(p) -> None:
    """``batch``'s choice of the frames of 4D and cine inputs."""
    p.add_argument(
        "--frame",
        type=int,
        metavar="N",
        help="frame (phase) of 4D or cine DICOM inputs, 0-based; a manifest's frame column overrides it",
    )
    p.add_argument(
        "--frames",
        choices=["ed-es", "all"],
        help="what a cine (a 4D or cine DICOM input with no frame picked) runs: ed-es (the default) segments "
        "every frame with the primary alone, sets ED and ES from the LV volume curve and runs the method on "
        "those two; all runs the method on every frame; both write curves.csv",
    )


def _add_batch_worker_options(p) -> None:
    """``batch``'s options of the workers, the backend and the triage report."""
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads per worker; without it: the CPUs this process may use (affinity, cgroup "
        "quota) shared out among the workers (with --ray: the worker's CPUs)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="worker processes on this machine, one model each, the CPUs shared out among them (with "
        "--threads: that many each); more than one gets more cases through a multi-core CPU",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the cases on a Ray cluster: auto (the one this machine belongs to), HOST:PORT, "
        "ray://HOST:PORT, or local (start one here); needs the [cluster] extra and a filesystem "
        "every node sees inputs and OUTDIR on at the same paths",
    )
    p.add_argument(
        "--ray-workers",
        type=int,
        metavar="N",
        help="Ray actors, one model each; without it: one per GPU, else the cluster's CPUs / CPUs per worker",
    )
    p.add_argument("--ray-cpus-per-worker", type=float, default=1.0, metavar="C", help="CPUs each Ray actor asks for")
    p.add_argument("--backend", choices=["auto", "torch", "onnx"], help=BACKEND_HELP + " (with --ray: torch)")
    p.add_argument("--review-map", metavar="MAP", help=REVIEW_MAP_HELP)
    p.add_argument("--no-report", action="store_true", help="do not write triage.html")
    p.add_argument(
        "--report-thumbnails",
        type=int,
        default=200,
        metavar="N",
        help="thumbnails in triage.html for the N least trusted cases (the rest are listed without)",
    )


def _add_bundle_parsers(sub) -> None:
    """``cardseg sizes``, ``info`` and ``init-bundle``."""
    sub.add_parser(
        "sizes",
        help="parameter count of every network size",
        description="Print the parameter count of every size of the two time-conditioned networks "
        "(time-swinunetr and time-unet, named ARCH:SIZE as init-bundle's --primary and --reference take "
        "them), for 4 classes and 1 image channel.",
    )

    p = sub.add_parser(
        "info",
        help="describe a bundle",
        description="Check a bundle as a run would and describe it: its id, classes, network grid, sampled "
        "steps, networks, calibration, out-of-domain threshold and flagged-region rules.",
    )
    p.add_argument("--bundle", metavar="PATH", help="bundle folder (default: $CARDSEG_BUNDLE or the shipped one)")

    p = sub.add_parser(
        "init-bundle",
        help="write an untrained (random, seeded) bundle, e.g. for tests",
        description="Write an untrained bundle (random weights from --seed) into OUTDIR: bundle.json and "
        "the two safetensors files, e.g. for tests, to try the Slicer module, or to start a new task. "
        "Every option is checked before anything is written.",
    )
    p.add_argument(
        "output", metavar="OUTDIR", help="new or empty folder for the bundle (with --overwrite: a bundle cardseg wrote)"
    )
    p.add_argument(
        "--primary", default="time-unet:tiny", help="ARCH:SIZE, e.g. time-swinunetr:base, discriminative:unet"
    )
    p.add_argument("--reference", default="time-unet:micro", help="ARCH:SIZE, as --primary")
    p.add_argument(
        "--input-size", type=int, default=64, help="network grid side in pixels (SwinUNETR: a multiple of 32)"
    )
    p.add_argument("--spacing", type=float, default=3.0, help="network pixel spacing in mm")
    p.add_argument("--seed", type=int, default=0, help="random seed, 0 to 2^32-1")
    p.add_argument(
        "--overwrite", action="store_true", help="replace a bundle folder that cardseg wrote (never anything else)"
    )


def _add_synth_parser(sub) -> None:
    """``cardseg synth``: the synthetic phantom."""
    p = sub.add_parser("synth", help="write a synthetic short-axis cine-like volume (and its labels)")
    p.add_argument("output", metavar="OUTPUT.nii.gz", help=f"image file ({', '.join(SYNTH_SUFFIXES)})")
    p.add_argument("--labels", metavar="PATH", help="also write the label map here")
    p.add_argument("--seed", type=int, default=0, help=f"0 to {SYNTH_MAX_SEED}")
    p.add_argument("--slices", type=int, default=10, help=f"1 to {SYNTH_MAX_SLICES}")
    p.add_argument("--frames", type=int, metavar="N", help="a beating cine, N frames over 800 ms: 4-D NIfTI")
    p.add_argument("--truth", action="store_true", help="with --frames: also write its truth, NAME.truth.json")
    p.add_argument("--overwrite", action="store_true", help="replace existing files (never a folder)")


def _check_segment_args(a) -> None:
    check_run_options(a.batch_size, a.threads, a.frame)
    _check_backend(a)
    check_file_or_folder(a.input, kind_of(a.input), "not an image file or a folder")


def _check_backend(a) -> None:
    """Settle ``a.backend`` (none given: ``$CARDSEG_BACKEND``, else ``auto``). ``onnx``: ONNX Runtime
    importable, the CPU (``--device auto`` becomes ``cpu``), not with ``--ray``; ``auto`` with
    ``--ray`` becomes ``torch`` (the workers load the torch networks). A malformed ``$CARDSEG_RECENTRE``
    is refused here too, before any work."""
    from cardseg.bundle.onnx_backend import available, default_backend
    from cardseg.io.field_of_view import recentre_margin

    recentre_margin({})
    a.backend = getattr(a, "backend", None) or default_backend()
    if getattr(a, "ray", None) and a.backend == "auto":
        a.backend = "torch"
    if a.backend != "onnx":
        return
    if a.device == "cuda":
        raise CardsegError("--backend onnx runs on the CPU; use --device cpu or --backend torch")
    if getattr(a, "ray", None):
        raise CardsegError("--backend onnx is not available with --ray (the workers load the torch networks)")
    reason = available()
    if reason:
        raise CardsegError(reason)
    a.device = "cpu"


def cmd_segment(a) -> int:
    # Every check that needs no torch comes first, in this order: options, the input's existence and
    # the output location, bundle (schema, files), input image. Only then torch, the networks and the work.
    from cardseg.bundle.folder import check_bundle, check_method
    from cardseg.bundle.review_rules import with_review_map
    from cardseg.io.inputs import parse_spacing
    from cardseg.io.outdir import check_output
    from cardseg.io.volume import read_volume

    t_start = time.perf_counter()
    _check_segment_args(a)
    spacing = parse_spacing(a.spacing) if a.spacing else None
    out = check_output(a.output, a.overwrite, inputs=[a.input])
    checked = with_review_map(check_bundle(a.bundle), a.review_map)
    bundle_root, config = checked.root, checked.config
    check_method(bundle_root, config, a.method)
    from cardseg.base.cpus import default_threads

    threads = a.threads or default_threads()
    from cardseg.bundle.onnx_backend import settle_device, start_cpu_lookup
    from cardseg.io.written import set_threads

    set_threads(threads)  # the outputs' compression threads

    # the ONNX sessions open while the input is read
    lookup = start_cpu_lookup(config, checked.weights, a.backend, a.device, threads)
    volume = read_volume(a.input, a.frame, spacing)

    from cardseg.base.progress import make_progress
    from cardseg.bundle.loading import load_bundle
    from cardseg.segment import FileOptions, SegmentOptions, segment_file

    # both ONNX models cached and opened, on the CPU: numpy throughout, torch is never imported
    device = settle_device(a.device, lookup, threads)
    progress = make_progress(a.progress, a.quiet)
    try:
        bundle = load_bundle(
            bundle_root,
            device=device,
            backend=a.backend,
            progress=progress,
            prepared=True,
            checked=checked,
            onnx_lookup=lookup,
            threads=threads,
        )
    finally:
        progress.close()
    if not a.quiet:
        for note in bundle.notes:
            print(f"cardseg: note: {note}", file=sys.stderr)
    try:
        r = segment_file(
            a.input,
            out,
            bundle,
            SegmentOptions(method=a.method, device=device, batch_size=a.batch_size, progress=progress),
            FileOptions(frame=a.frame, spacing=spacing, overwrite=a.overwrite),
            volume=volume,
            t_start=t_start,
        )
    finally:
        progress.close()  # before any error line, so that it never shares a line with a half bar
    if not a.quiet:
        n = r["slices"]
        agr = "" if r["agreement"] is None else f", agreement {r['agreement']:.3f}"
        ood = " (OUT OF DOMAIN)" if r.get("out_of_domain") else ""
        nreg = len(r["regions"])
        print(
            f"{out}: {n} slice{'s' if n != 1 else ''}, method {a.method}{agr}{ood}, "
            f"{nreg} flagged region{'s' if nreg != 1 else ''}, {time.perf_counter() - t_start:.1f} s"
        )
    return 0


def cmd_batch(a) -> int:
    from cardseg.cohort.batch import main_from_args

    _check_backend(a)
    return main_from_args(a)


def cmd_sizes(a) -> int:
    from cardseg.method.networks import SWIN_SIZES, UNET_SIZES, build_network, count_parameters

    def count(arch: str, size: str) -> int:
        return count_parameters(build_network({"arch": arch, "size": size, "num_classes": 4}))

    rows = [
        (f"time-swinunetr:{size} (feature_size {fs})", count("time-swinunetr", size)) for size, fs in SWIN_SIZES.items()
    ]
    rows += [(f"time-unet:{size}", count("time-unet", size)) for size in UNET_SIZES]
    width = max(len(name) for name, _ in rows)
    print(f"{'network':{width}s} {'parameters':>12s}")
    for name, n in rows:
        print(f"{name:{width}s} {n:>12,d}")
    print("(4 classes, 1 image channel)")
    return 0


def cmd_info(a) -> int:
    from cardseg.bundle.loading import load_bundle

    b = load_bundle(a.bundle)
    c = b.config
    print(f"bundle {b.ident} at {b.path}")
    print(f"  classes: {', '.join(b.class_names)}")
    print(f"  grid: {c['input_size']} x {c['input_size']} at {c['pixel_spacing_mm']} mm")
    print(f"  steps: {b.sampled_steps} of T = {c['diffusion']['num_steps']}")
    for role in ("primary", "reference"):
        s = c["networks"][role]
        print(f"  {role}: {s['arch']}:{s.get('size', '')} ({s.get('parameters', 0):,d} parameters)")
    print(f"  calibration: {b.calibrator!r} (fitted: {c['calibration'].get('fitted', False)})")
    print(f"  out-of-domain agreement threshold: {c.get('agreement', {}).get('out_of_domain_threshold')}")
    from cardseg.review.regions import describe_rule

    print(f"  flagged regions: {describe_rule(c.get('regions') or {})}")
    from cardseg.bundle.review_rules import choose_review_map, review_rules

    for name in list(review_rules(c))[1:]:  # each earlier rule, checked as a run would check it
        try:
            text = describe_rule(choose_review_map(c, name, "the bundle")["regions"])
        except CardsegError as exc:
            text = f"unusable: {exc}"
        print(f"  with --review-map {name}: {text}")
    return 0


def cmd_init_bundle(a) -> int:
    from cardseg.bundle.scaffold import InitOptions, init_bundle

    options = InitOptions(
        primary=a.primary, reference=a.reference, input_size=a.input_size, pixel_spacing_mm=a.spacing, seed=a.seed
    )
    path = init_bundle(a.output, options, overwrite=a.overwrite)
    print(f"wrote untrained bundle {path}")
    return 0


def _check_synth_args(a) -> None:
    """``synth``'s options and output files, refused in one line before anything is computed."""
    check_int_range("--slices", a.slices, 1, SYNTH_MAX_SLICES)
    check_int_range("--seed", a.seed, 0, SYNTH_MAX_SEED)
    check_new_file(a.output, a.overwrite, "the output", SYNTH_SUFFIXES)
    if a.labels:
        check_new_file(a.labels, a.overwrite, "--labels", SYNTH_SUFFIXES)
        if os.path.realpath(a.labels) == os.path.realpath(a.output):  # also through a linked folder
            raise CardsegError(f"{a.labels}: --labels must differ from the output")
    if a.frames is not None or a.truth:
        from cardseg.bundle.beating import check_cine_request

        check_cine_request(a.output, a.labels, a.frames, a.slices, a.truth, a.overwrite)


def _write_image_atomic(image, path: str) -> None:
    """Write ``image`` to a temporary file beside ``path`` (same suffix), read it back whole and
    compare, then rename it over ``path``. A failed or short write (a full disk, a file-size
    limit: SimpleITK may only print ``NWAD`` and return) raises an :class:`OSError` naming
    ``path``, which is then left as it was, and no temporary file stays behind."""
    import numpy as np
    import SimpleITK as sitk

    from cardseg.io.written import IncompleteWrite, muted_native_stderr

    folder, name = os.path.split(path)
    suffix = next(s for s in SYNTH_SUFFIXES if name.lower().endswith(s))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.cardseg-tmp{suffix}")
    try:
        with muted_native_stderr() as lines:
            try:
                sitk.WriteImage(image, tmp)
                back = sitk.ReadImage(tmp)  # kept alive while its array view is compared
                same = np.array_equal(sitk.GetArrayViewFromImage(back), sitk.GetArrayViewFromImage(image))
            except RuntimeError:
                same = False
        if not same or any("NWAD" in line for line in lines):
            raise IncompleteWrite(path)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def cmd_synth(a) -> int:
    from cardseg.bundle.phantom import synthetic_cine_volume

    _check_synth_args(a)
    if a.frames is not None:
        from cardseg.bundle.beating import write_cine

        written = write_cine(a.output, a.labels, (a.frames, a.slices, a.seed), a.truth, _write_image_atomic)
        print(f"wrote a {a.frames}-frame cine: " + ", ".join(written))
        return 0
    vol, lab = synthetic_cine_volume(shape=(a.slices, 192, 176), seed=a.seed)
    _write_image_atomic(vol.to_image(), a.output)
    if a.labels:
        _write_image_atomic(vol.to_image(lab), a.labels)
    print(f"wrote {a.output}" + (f" and {a.labels}" if a.labels else ""))
    return 0


def cmd_serve(a) -> int:
    from cardseg.serve import serve

    return serve(a, build_parser, _check_segment_args, _check_backend)


COMMANDS = {
    "segment": cmd_segment,
    "batch": cmd_batch,
    "sizes": cmd_sizes,
    "info": cmd_info,
    "init-bundle": cmd_init_bundle,
    "synth": cmd_synth,
    "serve": cmd_serve,
}


#: the commands whose ``--eof stop`` watches standard input here (``serve`` reads its own)
EOF_WATCHED = ("segment", "batch")


def main(argv: Optional[List[str]] = None) -> int:
    """Run one command. SIGTERM is handled like Ctrl-C in every command (the same cleanup of
    temporaries and locks), then reported as ``terminated`` with exit status 143."""
    from cardseg.base.interrupt import EXIT_TERMINATED, SigtermState, sigterm_as_interrupt

    argv = list(sys.argv[1:] if argv is None else argv)
    sigterm = SigtermState()
    try:
        with sigterm_as_interrupt() as sigterm:
            # a built-in command needs no scan of the installed packages' entry points (30-55 ms)
            plugins = {} if argv and argv[0] in COMMANDS else plugin_commands()
            if argv and argv[0] in plugins:
                return run_plugin(argv[0], plugins[argv[0]], argv[1:])
            parser = build_parser(plugin_help=not argv or argv[0] in ("-h", "--help"), plugins=plugins)
            a = parser.parse_args(argv)
            if a.command in EOF_WATCHED and a.eof == "stop":
                from cardseg.base.input_watch import stop_on_eof

                stop_on_eof()  # inside the SIGTERM handler: the end of input stops the run as SIGTERM does
            return COMMANDS[a.command](a)
    except CardsegError as exc:
        print(f"cardseg: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if sigterm.received:
            print("cardseg: terminated (SIGTERM); nothing half-written was left", file=sys.stderr)
            return EXIT_TERMINATED
        print("cardseg: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout's reader went away (``cardseg sizes | head -1``): quiet, as other tools
        try:  # no second error when the interpreter flushes stdout at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (AttributeError, ValueError, OSError):  # a stdout without a descriptor (a library caller's)
            pass
        return 141
    except OSError as exc:  # a disk that fills up or a folder that vanishes while writing
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"cardseg: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1


#: commands after which nothing is left to do but exit: every output is written, renamed into
#: place and closed, no worker or temporary folder outlives them
QUICK_EXIT = ("segment", "serve")


def console_main() -> None:
    """The ``cardseg`` console script: :func:`main`, then the process's exit code.

    After ``segment`` the interpreter skips its own teardown (``os._exit`` once stdout and stderr
    are flushed): unloading torch and MONAI takes about half a second of every run and frees
    nothing a finished process needs (``Testing/benchmarks/whole_run.py``, "python start/exit").
    So does any command run with ``--eof stop``: the thread reading its input would make the
    teardown abort, and after a stop at end of input the stop's grace period
    (:func:`cardseg.base.input_watch.stop_self`) must not run out in it.
    """
    from cardseg.base.input_watch import INPUT_WATCHED

    rc = main()
    if (sys.argv[1:2] and sys.argv[1] in QUICK_EXIT) or INPUT_WATCHED.is_set():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    console_main()

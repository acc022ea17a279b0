"""`gluon-survey inspect`: compile the survey's kernels for sm_90a / sm_100a on any machine (no GPU
needed) and report what the hardware will run: registers, spills, shared and tensor memory, and
counts of the SASS instructions that tell the rungs apart (HGMMA vs UTCHMMA, TMA, register
reallocation, barriers).

    gluon-survey inspect                          # every mode that owns kernels, sm_90a and sm_100a
    gluon-survey inspect triton,warpspec --arch sm_90a --format json
    gluon-survey inspect --dump out/asm           # also write <mode>-<arch>-<kernel>.{ttgir,ptx,sass}

Each provider module that owns kernels defines `compile_specs(capability, dtype)` returning
`launch.CompileSpec`s (an empty list for an arch it does not support); modes without kernels of
ours (`torch`, `torch.compile`) are skipped, or noted when named explicitly. Every spec is compiled
with `triton.compile(ASTSource | GluonASTSource, target=GPUTarget("cuda", cc, 32))`, then the cubin
is read with the `cuobjdump` shipped in the triton wheel. Progress (one kernel at a time) goes to
stderr. A kernel that fails to compile becomes a row with `error` set; the exit status is then 1.
`--dtype` takes the timing command's dtypes: fp16, bf16, fp8 (e4m3, per-tensor scales) and fp8-row
(e4m3, row-wise scales). An architecture that no mode's kernels target (`targeted_archs`, from the
registry) and a `--dump` path that cannot be a directory or cannot be written are usage errors
(exit status 2), found before anything compiles; files that cannot be written after all end the
command with status 1, saying so (the kernels' rows are not made errors for it).

The engine is reusable (the CPU tests use it): `compile_spec(spec, arch) -> Compiled`,
`disassemble(cubin)`, `sass_counts(cubin) -> Counter` (over `count_opcodes(sass_text)`),
`resource_usage(cubin) -> ResourceUsage` (over `parse_resource_usage(text)`),
`ptx_register_hints(ptx)`, `inspect_spec(spec, arch) -> KernelReport` and `collect(...)`.

`sass_counts` keys: every instruction counts under its base mnemonic (`HGMMA`, `SYNCS`, `LDL`); the
instructions of the families in `FULL_FORM_FAMILIES` also count under their full opcode
(`HGMMA.64x256x16.F32`, `SYNCS.ARRIVE.TRANS64`, `LDTM.x128`) when it has modifiers. Keys without a
dot are therefore base counts, keys with a dot full-form counts.

`spill_bytes` is the per-thread local memory cuobjdump reports (`STACK` + `LOCAL`): these kernels
have no local arrays or calls, so any of it is register spill space (ptxas puts spills in the stack
frame); the LDL/STL counts corroborate it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import triton

from gluon_survey import registry
from gluon_survey.launch import SCALINGS, CompileSpec
from gluon_survey.registry import Mode

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

PROG = "gluon-survey inspect"
DEFAULT_ARCHS = ("sm_90a", "sm_100a")
FP8 = "float8_e4m3fn"
# --dtype spelling -> (the dtype `compile_specs` receives, a torch dtype name as the kernels expect;
# the fp8 scales' kind, `launch.SCALINGS`), with the timing command's meanings: fp8 is e4m3
# operands with per-tensor scales, fp8-row with row-wise scales (both a bf16 C, the modes with `fp8`).
DTYPES: dict[str, tuple[str, str | None]] = {
    "fp16": ("float16", None),
    "float16": ("float16", None),
    "half": ("float16", None),
    "bf16": ("bfloat16", None),
    "bfloat16": ("bfloat16", None),
    "fp8": (FP8, "tensor"),
    "float8_e4m3fn": (FP8, "tensor"),
    "fp8-row": (FP8, "row"),
}

# Instruction families whose full opcodes (with modifiers) are also counted.
FULL_FORM_FAMILIES = (
    "HGMMA",
    "QGMMA",  # wgmma with fp8 operands
    "HMMA",
    "UTC",  # tcgen05: UTCHMMA, UTCQMMA, ..., UTCBAR, UTCATOMSWS, UTCCP
    "LDTM",
    "STTM",
    "UTMA",  # TMA: UTMALDG, UTMASTG, UTMAPF, UTMACMDFLUSH, UTMACCTL
    "LDG",  # global loads: LDG.E.128 is a 16-byte vector
    "LDL",
    "STL",
    "USETMAXREG",
    "SYNCS",
    "WARPGROUP",
)

# Table columns: (header, base mnemonics whose counts are shown "/"-separated). A column whose
# counts are zero in every row is left out, except those in ALWAYS_SHOWN. The JSON has every count.
COUNT_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("TMA ld/st", ("UTMALDG", "UTMASTG")),
    ("LDL/STL", ("LDL", "STL")),
    ("UTCBAR/LDTM/STTM", ("UTCBAR", "LDTM", "STTM")),
    ("SYNCS", ("SYNCS",)),
    ("WARPGROUP", ("WARPGROUP",)),
    ("USETMAXREG", ("USETMAXREG",)),
)
ALWAYS_SHOWN = ("TMA ld/st", "LDL/STL")
_MMA_OPCODE = re.compile(r"[HQ]GMMA|HMMA|UTC\w*MMA")  # tensor-core MMA base mnemonics (QGMMA: fp8)

# One SASS instruction line: "/*0a50*/   @!UP0 HGMMA.64x256x16.F32 R24, gdesc[UR8].tnspB, R24 ;"
_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P(?:T|\d+)\s+)?([A-Z][A-Za-z0-9_.]*)")
_RESOURCE_FUNCTION = re.compile(r"^\s*Function\s+([^:\s]+)\s*:\s*$")
_RESOURCE_FIELD = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")


# ----------------------------------------------------------------------------------------------
# Engine
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compiled:
    """One spec compiled for one arch: the artefacts and the compiler's metadata."""

    spec: CompileSpec
    arch: str  # normalized, e.g. "sm_90a"
    name: str  # the kernel function's name in the cubin
    cubin: bytes
    ptx: str
    ttgir: str
    num_warps: int  # as the compiled metadata records it (all partitions of a WS kernel)
    shared_bytes: int  # dynamic shared memory the launch requests
    tmem_cols: int | None  # tensor-memory columns allocated (Blackwell), None where not reported
    seconds: float


@dataclass(frozen=True)
class ResourceUsage:
    """Per-thread and per-CTA resources of one cubin function, from `cuobjdump --dump-resource-usage`."""

    function: str
    registers: int
    stack_bytes: int
    local_bytes: int
    static_shared_bytes: int

    @property
    def spill_bytes(self) -> int:
        return self.stack_bytes + self.local_bytes


@dataclass
class KernelReport:
    """One row of `inspect`: everything is None/empty when `error` is set."""

    mode: str
    arch: str
    kernel: str
    num_warps: int | None = None
    threads: int | None = None  # PTX .reqntid: the CTA size actually launched
    registers: int | None = None
    spill_bytes: int | None = None
    stack_bytes: int | None = None
    local_bytes: int | None = None
    shared_bytes: int | None = None
    static_shared_bytes: int | None = None
    tmem_cols: int | None = None
    ptx_maxnreg: int | None = None
    setmaxnreg: dict[str, list[int]] = field(default_factory=dict)  # {"inc": [240], "dec": [24]}
    sass: dict[str, int] = field(default_factory=dict)
    compile_s: float | None = None
    error: str | None = None
    triton_version: str = triton.__version__

    def count(self, opcode: str) -> int:
        """SASS count of a base mnemonic ("HGMMA") or full form ("HGMMA.64x256x16.F32"); 0 if absent."""
        return self.sass.get(opcode, 0)


def parse_arch(arch: str) -> tuple[str, tuple[int, int]]:
    """'sm_90a' / 'sm_90' / '90' -> ('sm_90a', (9, 0)); 'sm_100a' -> ('sm_100a', (10, 0))."""
    m = re.fullmatch(r"(?:sm_?)?(\d{2,3})a?", arch.strip().lower())
    if not m:
        raise ValueError(f"unknown arch {arch!r}; expected e.g. sm_90a or sm_100a")
    cc = int(m.group(1))
    return f"sm_{cc}a", (cc // 10, cc % 10)


def targeted_archs(modes: Iterable[Mode] | None = None) -> dict[str, list[str]]:
    """Architecture ("sm_90a") -> the modes (default: all) whose kernels target it, from the
    registry's `Mode.archs` (modes that run on "any CUDA GPU" own no kernel and target none)."""
    targeted: dict[str, list[str]] = {}
    for mode in registry.MODES if modes is None else modes:
        for arch in mode.archs:
            if re.fullmatch(r"sm_\d{2,3}a?", arch):
                targeted.setdefault(parse_arch(arch)[0], []).append(mode.name)
    return targeted


def describe_targets(targeted: dict[str, list[str]]) -> str:
    """'sm_90a, sm_100a (Blocked, ..., triton); sm_120a (triton)': archs with the same modes together."""
    by_modes: dict[tuple[str, ...], list[str]] = {}
    for arch, names in targeted.items():
        by_modes.setdefault(tuple(names), []).append(arch)
    return "; ".join(f"{', '.join(archs)} ({', '.join(names)})" for names, archs in by_modes.items())


def cuobjdump_path() -> str:
    """The cuobjdump bundled with the installed triton wheel (or one on PATH)."""
    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if os.path.exists(bundled):
        return bundled
    found = shutil.which("cuobjdump")
    if found is None:
        raise FileNotFoundError(f"no cuobjdump: not at {bundled} and not on PATH")
    return found


@functools.lru_cache(maxsize=64)
def _cuobjdump(cubin: bytes, flag: str) -> str:
    with tempfile.TemporaryDirectory(prefix="gluon-survey-") as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        proc = subprocess.run([cuobjdump_path(), flag, path], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump {flag} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def disassemble(cubin: bytes) -> str:
    """SASS text of a cubin (`cuobjdump --dump-sass`)."""
    return _cuobjdump(bytes(cubin), "--dump-sass")


def count_opcodes(sass: str) -> Counter[str]:
    """Opcode counts of SASS text: base mnemonics, plus full forms of FULL_FORM_FAMILIES (see module doc)."""
    counts: Counter[str] = Counter()
    for line in sass.splitlines():
        m = _SASS_LINE.match(line)
        if not m:
            continue
        opcode = m.group(1)
        base = opcode.split(".", 1)[0]
        counts[base] += 1
        if opcode != base and base.startswith(FULL_FORM_FAMILIES):
            counts[opcode] += 1
    return counts


def sass_counts(cubin: bytes) -> Counter[str]:
    """`count_opcodes` of the cubin's disassembly."""
    return count_opcodes(disassemble(cubin))


def parse_resource_usage(text: str, function: str | None = None) -> ResourceUsage:
    """Parse `cuobjdump --dump-resource-usage` output: the entry for `function`, or (default) the
    function with the most registers (Triton cubins hold a single kernel)."""
    found: list[ResourceUsage] = []
    current = None
    for line in text.splitlines():
        m = _RESOURCE_FUNCTION.match(line)
        if m:
            current = m.group(1)
            continue
        fields = dict(_RESOURCE_FIELD.findall(line))
        if current is not None and "REG" in fields:
            found.append(
                ResourceUsage(
                    function=current,
                    registers=int(fields["REG"]),
                    stack_bytes=int(fields.get("STACK", 0)),
                    local_bytes=int(fields.get("LOCAL", 0)),
                    static_shared_bytes=int(fields.get("SHARED", 0)),
                )
            )
            current = None
    if function is not None:
        found = [r for r in found if r.function == function] or found
    if not found:
        raise RuntimeError(f"no function in cuobjdump's resource usage:\n{text}")
    return max(found, key=lambda r: r.registers)


def resource_usage(cubin: bytes, function: str | None = None) -> ResourceUsage:
    """Registers, stack/local (spill) bytes and static shared memory of a cubin's kernel."""
    return parse_resource_usage(_cuobjdump(bytes(cubin), "--dump-resource-usage"), function)


def ptx_register_hints(ptx: str) -> tuple[int | None, dict[str, list[int]], int | None]:
    """(`.maxnreg`, `setmaxnreg` values by direction, `.reqntid` thread count) found in PTX."""
    maxnreg = re.search(r"^\s*\.maxnreg\s+(\d+)", ptx, re.MULTILINE)
    setmax: dict[str, set[int]] = {}
    for direction, regs in re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx):
        setmax.setdefault(direction, set()).add(int(regs))
    reqntid = re.search(r"^\s*\.reqntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?", ptx, re.MULTILINE)
    threads = None
    if reqntid:
        threads = 1
        for dim in reqntid.groups():
            threads *= int(dim) if dim else 1
    return (
        int(maxnreg.group(1)) if maxnreg else None,
        {k: sorted(v) for k, v in sorted(setmax.items())},
        threads,
    )


def _ast_source(spec: CompileSpec) -> object:
    attrs = {(spec.fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in spec.divisible}
    if spec.gluon:
        from gluon_survey.compat import GluonASTSource

        return GluonASTSource(spec.fn, spec.signature, spec.constexprs, attrs)
    from triton.compiler import ASTSource

    return ASTSource(spec.fn, spec.signature, spec.constexprs, attrs)


def compile_spec(spec: CompileSpec, arch: str) -> Compiled:
    """Compile `spec` for `arch` ("sm_90a", "sm_100a", ...) without a GPU; raises on failure."""
    from triton.backends.compiler import GPUTarget

    arch, (major, minor) = parse_arch(arch)
    start = time.perf_counter()
    kernel = triton.compile(
        _ast_source(spec), target=GPUTarget("cuda", major * 10 + minor, 32), options=dict(spec.options)
    )
    seconds = time.perf_counter() - start
    meta = kernel.metadata
    tmem = getattr(meta, "tmem_size", None)
    return Compiled(
        spec=spec,
        arch=arch,
        name=getattr(meta, "name", getattr(spec.fn, "__name__", "?")),
        cubin=kernel.asm["cubin"],
        ptx=kernel.asm.get("ptx", ""),
        ttgir=kernel.asm.get("ttgir", ""),
        num_warps=meta.num_warps,
        shared_bytes=meta.shared,
        tmem_cols=tmem if tmem else None,
        seconds=seconds,
    )


def report_compiled(c: Compiled) -> KernelReport:
    """Parse a compiled kernel's cubin and PTX into a report row."""
    usage = resource_usage(c.cubin, c.name)
    maxnreg, setmax, threads = ptx_register_hints(c.ptx)
    counts = sass_counts(c.cubin)
    return KernelReport(
        mode=c.spec.mode,
        arch=c.arch,
        kernel=c.spec.kernel,
        num_warps=c.num_warps,
        threads=threads,
        registers=usage.registers,
        spill_bytes=usage.spill_bytes,
        stack_bytes=usage.stack_bytes,
        local_bytes=usage.local_bytes,
        shared_bytes=c.shared_bytes,
        static_shared_bytes=usage.static_shared_bytes,
        tmem_cols=c.tmem_cols,
        ptx_maxnreg=maxnreg,
        setmaxnreg=setmax,
        sass=dict(counts.most_common()),
        compile_s=round(c.seconds, 2),
    )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip()}"


def inspect_spec(spec: CompileSpec, arch: str, dump_dir: Path | None = None) -> KernelReport:
    """Compile and report one spec; a failure to compile becomes a row with `error`, never an
    exception. With `dump_dir` its files are written there (`dump`): a failure to write them is
    not the kernel's, and raises OSError."""
    try:
        compiled = compile_spec(spec, arch)
        row = report_compiled(compiled)
    except Exception as exc:  # a broken kernel is a result to report, not a crash
        return KernelReport(mode=spec.mode, arch=_arch_label(arch), kernel=spec.kernel, error=_describe(exc))
    if dump_dir is not None:
        dump(compiled, dump_dir)
    return row


def with_scaling(spec: CompileSpec, scaling: str) -> CompileSpec:
    """An fp8 spec as the providers give it (row-wise scales, the epilogue that does the most)
    made for `scaling` ("tensor" or "row"): its SCALING constexpr (`launch.Scales.code`) and the
    label's `scales=`. A spec without SCALING is returned as it is."""
    if "SCALING" not in spec.constexprs:
        return spec
    label = re.sub(r"\bscales=\w+", f"scales={scaling}", spec.kernel)
    if label == spec.kernel and f"scales={scaling}" not in label:
        label += f" scales={scaling}"
    constexprs = {**spec.constexprs, "SCALING": SCALINGS.index(scaling) + 1}
    return dataclasses.replace(spec, kernel=label, constexprs=constexprs)


def _arch_label(arch: str) -> str:
    try:
        return parse_arch(arch)[0]
    except ValueError:
        return arch


def _file_stem(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.x-]+", "_", text).strip("_")


def dump(c: Compiled, directory: Path) -> list[Path]:
    """Write `<mode>-<arch>-<kernel>.{ttgir,ptx,sass}` into `directory`; returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = _file_stem(f"{c.spec.mode}-{c.arch}-{c.spec.kernel}")
    paths = []
    for ext, text in (("ttgir", c.ttgir), ("ptx", c.ptx), ("sass", disassemble(c.cubin))):
        path = directory / f"{stem}.{ext}"
        path.write_text(text)
        paths.append(path)
    return paths


def collect(
    modes: Sequence[Mode],
    archs: Sequence[str],
    dtype: str = "float16",
    *,
    scaling: str | None = None,
    explicit: bool = False,
    dump_dir: Path | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> tuple[list[KernelReport], list[str]]:
    """Compile every spec of every mode for every arch: (rows, notes for humans).

    `scaling` ("tensor" or "row") is the fp8 scales' kind (`with_scaling`); None compiles the
    providers' fp8 specs as they are (row-wise). With `explicit` (the user named the modes), a mode
    without kernels of ours yields a note;
    otherwise it is skipped quietly. A provider module that fails to import or whose
    `compile_specs` raises yields an error row. `progress(done, total, "mode arch kernel")` is
    called before each kernel compiles.
    """
    jobs: list[KernelReport | tuple[CompileSpec, str]] = []  # rows as they are, or specs to compile
    notes: list[str] = []
    for mode in modes:
        if dtype == FP8 and not mode.fp8:
            if explicit:
                notes.append(f"{mode.name}: no fp8 kernel")
            continue
        for arch in archs:
            label, capability = parse_arch(arch)
            try:
                module = mode.provider(capability)
            except Exception as exc:
                jobs.append(KernelReport(mode.name, label, "(import)", error=_describe(exc)))
                continue
            if not hasattr(module, "compile_specs"):
                note = f"{mode.name}: no kernel of ours to compile ({mode.summary})"
                if explicit and note not in notes:
                    notes.append(note)
                continue
            try:
                specs = module.compile_specs(capability, dtype)
            except Exception as exc:
                jobs.append(KernelReport(mode.name, label, "(compile_specs)", error=_describe(exc)))
                continue
            if not specs:
                notes.append(f"{mode.name}: nothing to compile for {label}")
            if dtype == FP8 and scaling is not None:
                specs = [with_scaling(spec, scaling) for spec in specs]
            jobs.extend((spec, label) for spec in specs)
    total, done = sum(not isinstance(job, KernelReport) for job in jobs), 0
    rows: list[KernelReport] = []
    for job in jobs:
        if isinstance(job, KernelReport):
            rows.append(job)
            continue
        spec, label = job
        if progress is not None:
            progress(done, total, f"{spec.mode} {label} {spec.kernel}")
        rows.append(inspect_spec(spec, label, dump_dir))
        done += 1
    return rows, notes


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------


def mma_forms(row: KernelReport) -> list[tuple[str, int]]:
    """Tensor-core MMA instructions by full form (base form where SASS has no modifiers, as for
    UTCHMMA), most frequent first."""
    forms: Counter[str] = Counter()
    for op, n in row.sass.items():
        base = op.split(".", 1)[0]
        if not _MMA_OPCODE.fullmatch(base):
            continue
        # a full form when SASS has one; the base only for opcodes without modifiers (UTCHMMA)
        if "." in op or not any(k.startswith(base + ".") for k in row.sass):
            forms[op] += n
    return forms.most_common()


def _short_error(error: str, limit: int = 200) -> str:
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    text = lines[0] if len(lines) == 1 else f"{lines[0].split(':', 1)[0]}: {lines[-1]}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_table(rows: Sequence[KernelReport], notes: Iterable[str] = ()) -> None:
    """Print the rows as a rich table, then the errors and notes. Count columns that are zero in
    every row are left out (`COUNT_COLUMNS`)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=300)  # piped: do not squeeze the table into 80 columns
    if not rows:
        console.print("nothing to compile")
        for note in notes:
            console.print(f"[dim]{escape(note)}[/dim]")
        return
    ok = [r for r in rows if r.error is None]

    def counts(r: KernelReport, ops: tuple[str, ...]) -> list[int]:
        return [r.count(op) for op in ops]

    columns = [
        (h, ops) for h, ops in COUNT_COLUMNS if h in ALWAYS_SHOWN or any(any(counts(r, ops)) for r in ok)
    ]
    show_setmax = any(r.setmaxnreg for r in ok)

    table = Table(title=f"gluon-survey inspect: triton {triton.__version__}, compiled without a GPU")
    for header in ("mode", "arch", "kernel"):
        table.add_column(header, no_wrap=True)
    for header in ("warps", "regs", "spill B", "smem B", "tmem"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("MMA", no_wrap=True)
    for header, _ in columns:
        table.add_column(header, justify="right", no_wrap=True)
    if show_setmax:
        table.add_column("setmaxnreg", no_wrap=True)

    def fmt(value: int | None) -> str:
        return "-" if value is None else f"{value:,}"

    for r in rows:
        if r.error is not None:
            cells = ["-"] * 5 + ["[red]error (below)[/red]"] + ["-"] * (len(columns) + show_setmax)
        else:
            warps = fmt(r.num_warps)
            if r.threads is not None and r.threads != 32 * (r.num_warps or 0):
                warps += f" ({r.threads // 32})"  # warp-specialized: more warps launched than num_warps
            forms = mma_forms(r)
            mma = " + ".join(f"{n} {op}" for op, n in forms) if forms else "[yellow]none[/yellow]"
            spill = fmt(r.spill_bytes) if not r.spill_bytes else f"[red]{fmt(r.spill_bytes)}[/red]"
            cells = [warps, fmt(r.registers), spill, fmt(r.shared_bytes), fmt(r.tmem_cols), mma]
            cells += ["/".join(map(str, counts(r, ops))) for _, ops in columns]
            if show_setmax:
                cells.append(" ".join(f"{k} {','.join(map(str, v))}" for k, v in r.setmaxnreg.items()) or "-")
        table.add_row(escape(r.mode), r.arch, escape(r.kernel), *cells)
    console.print(table)
    for r in rows:
        if r.error is not None:
            where = escape(f"{r.mode} {r.arch} {r.kernel}")
            console.print(f"[red]error[/red] {where}: {escape(_short_error(r.error))}")
    for note in notes:
        console.print(f"[dim]{escape(note)}[/dim]")


def to_json(rows: Sequence[KernelReport]) -> str:
    """The rows as a JSON list of objects (the KernelReport fields)."""
    return json.dumps([dataclasses.asdict(r) for r in rows], indent=2)


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gluon-survey inspect",
        description="Compile the survey's kernels for sm_90a/sm_100a without a GPU and report registers, "
        "spills, shared/tensor memory and SASS instruction counts.",
    )
    parser.add_argument(
        "modes",
        nargs="?",
        default=None,
        help="comma-separated modes (default: every mode that owns kernels); "
        f"known: {', '.join(registry.names())}",
    )
    parser.add_argument(
        "--arch",
        default=",".join(DEFAULT_ARCHS),
        help="comma-separated targets (default: %(default)s)",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument(
        "--dump", metavar="DIR", type=Path, default=None, help="write ttgir/ptx/sass files here"
    )
    parser.add_argument(
        "--dtype",
        default="fp16",
        choices=list(DTYPES),
        help="operand dtype, as the timing command's --dtype: fp16, bf16, fp8 (e4m3 with per-tensor "
        "scales, bf16 out), fp8-row (e4m3 with row-wise scales, bf16 out) (default: fp16)",
    )
    return parser


class _Progress:
    """Which kernel compiles now, on stderr: a rich progress bar in a terminal (gone when done),
    else one line per kernel (a log keeps them all)."""

    def __init__(self) -> None:
        from rich.console import Console

        self._console = Console(stderr=True)
        self._bar: tuple[Progress, TaskID] | None = None

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self._console.is_terminal:
            print(f"{PROG}: [{done + 1}/{total}] compiling {what}", file=sys.stderr, flush=True)
            return
        if self._bar is None:
            from rich import progress

            bar = progress.Progress(
                progress.TextColumn("{task.description}"),
                progress.BarColumn(),
                progress.MofNCompleteColumn(),
                progress.TimeElapsedColumn(),
                console=self._console,
                transient=True,
            )
            bar.start()
            self._bar = (bar, bar.add_task(f"compiling {what}", total=total))
        bar, task = self._bar
        bar.update(task, completed=done, description=f"compiling {what}")

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar[0].stop()


def _usage_error(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 2


def _dump_error(path: Path) -> str | None:
    """Why `--dump path` cannot be the directory the files go to (None when it can): asked before
    anything compiles, by writing a scratch file where the files (or the directory) will go."""
    if path.exists() and not path.is_dir():
        return f"--dump {path}: exists and is not a directory"
    if not path.exists() and not path.parent.is_dir():
        return f"--dump {path}: directory {path.parent} does not exist"
    where = path if path.exists() else path.parent
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as exc:
        return f"--dump {path}: cannot write in {where} ({exc.strerror or exc}); nothing was compiled"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `gluon-survey inspect`: 0 if every kernel compiled, 1 if any row has an
    error or --dump's files cannot be written, 2 for a bad mode, an arch no survey kernel targets,
    or a --dump path that cannot be a directory or cannot be written."""
    args = build_parser().parse_args(argv)
    try:
        modes = registry.parse_modes(args.modes)
        archs = list(dict.fromkeys(parse_arch(a)[0] for a in args.arch.split(",") if a.strip()))
    except (KeyError, ValueError) as exc:
        return _usage_error(exc.args[0] if exc.args else str(exc))
    targeted = targeted_archs()
    targets = f"the survey's kernels target {describe_targets(targeted)}"
    if not archs:
        return _usage_error(f"--arch {args.arch!r}: no architecture given; {targets}")
    untargeted = [a for a in archs if a not in targeted]
    if untargeted:
        return _usage_error(f"--arch: no survey kernel targets {', '.join(untargeted)}; {targets}")
    if args.dump is not None and (problem := _dump_error(args.dump)):
        return _usage_error(problem)
    dtype, scaling = DTYPES[args.dtype]
    try:
        with _Progress() as progress:
            rows, notes = collect(
                modes,
                archs,
                dtype,
                scaling=scaling,
                explicit=bool(args.modes),
                dump_dir=args.dump,
                progress=progress,
            )
    except OSError as exc:  # only writing --dump's files raises: a kernel that fails is a row
        print(
            f"{PROG}: error: cannot write the files of --dump {args.dump}: {exc.strerror or exc} "
            f"({exc.filename or args.dump}); the kernels compiled, their files were not written",
            file=sys.stderr,
        )
        return 1
    if args.format == "json":
        print(to_json(rows))
        for note in notes:
            print(note, file=sys.stderr)
    else:
        render_table(rows, notes)
    if args.dump is not None:
        dumped = sum(r.error is None for r in rows)
        print(f"{PROG}: ttgir, ptx and sass of {dumped} kernels in {args.dump}", file=sys.stderr)
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Compare two `gluon-survey inspect --format json` outputs kernel by kernel: registers, spills,
shared and tensor memory, setmaxnreg and every SASS opcode count. For refactors that must not
change the machine code:

    git stash; gluon-survey inspect --format json > before.json; git stash pop
    gluon-survey inspect --format json > after.json
    python scripts/compare_inspect.py before.json after.json    # exit 1 if any kernel differs

Kernel labels are matched after normalizing the B-layout suffixes older versions wrote
(" Brow"/" kn" -> " B=row", " Bt"/" nk" -> " B=t", " epi64 " -> " C128x64x2 "); kernels in only
one file are listed."""

import json
import re
import sys

FIELDS = ("registers", "spill_bytes", "shared_bytes", "tmem_cols", "ptx_maxnreg", "setmaxnreg", "num_warps")


def _label(kernel: str) -> str:
    kernel = re.sub(r" (Brow|kn)$", " B=row", kernel)
    kernel = re.sub(r" (Bt|nk)$", " B=t", kernel)
    return kernel.replace(" epi64 ", " C128x64x2 ")  # warpspec_tcgen05 before 7ff3584


def _rows(path: str) -> dict:
    with open(path) as f:
        return {(r["mode"], r["arch"], _label(r["kernel"])): r for r in json.load(f)}


def main(old_path: str, new_path: str) -> int:
    old, new = _rows(old_path), _rows(new_path)
    differ = 0
    for key in sorted(old.keys() | new.keys()):
        if key not in new or key not in old:
            print(f"{'only in ' + (old_path if key in old else new_path)}: {' | '.join(key)}")
            continue
        o, n = old[key], new[key]
        diffs = [f"{f}: {o.get(f)} -> {n.get(f)}" for f in FIELDS if o.get(f) != n.get(f)]
        for op in sorted(set(o["sass"]) | set(n["sass"])):
            if o["sass"].get(op, 0) != n["sass"].get(op, 0):
                diffs.append(f"{op}: {o['sass'].get(op, 0)} -> {n['sass'].get(op, 0)}")
        if n.get("error"):
            diffs.append(f"error: {n['error'].splitlines()[0]}")
        if diffs:
            differ += 1
            print(f"differs: {' | '.join(key)}\n    " + "\n    ".join(diffs))
    print(f"{len(old.keys() & new.keys()) - differ} kernels identical, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

#!/usr/bin/python3
"""The CPU kernels' instruction-set variants keep their code to themselves.

Each variant's objects (kernels/cpu/isa.h) define their functions in the
variant's own namespaces: pstar::kernels::cpu_<variant>, and the inline
namespace isa_<variant> that kernels/half.h opens. What else they define can
only be weak copies of the C++ library's templates and inline functions, one
of which the linker keeps for the whole program: those must be baseline x86-64
code, or a copy compiled for AVX-512 could be the one every caller runs, and
fault on a CPU without it (kernels/cpu/isa_target.h). This checks both, the
second on the copies' instructions.

  variant_symbols_test.py VARIANT OBJECT...
"""
import re
import subprocess
import sys

# Mnemonics past baseline x86-64 (SSE2): every VEX/EVEX instruction starts
# with "v"; AVX-512 mask registers' with "k"; the rest are BMI1/2, LZCNT,
# MOVBE, POPCNT and the common SSSE3/SSE4 ones.
EXTENDED = {
    "andn", "bextr", "blsi", "blsmsk", "blsr", "bzhi", "mulx", "pdep", "pext", "rorx", "sarx", "shlx", "shrx",
    "tzcnt", "lzcnt", "movbe", "popcnt", "pshufb", "palignr", "pmulld", "ptest", "pinsrb", "pinsrd", "pinsrq",
    "pextrb", "pextrd", "pextrq", "roundss", "roundsd", "roundps", "roundpd", "blendps", "blendpd", "blendvps",
    "blendvpd", "pblendw", "pblendvb", "dpps", "dppd", "pminsd", "pmaxsd", "pminud", "pmaxud", "pmovsxbw",
    "pmovzxbw", "pmovsxwd", "pmovzxwd", "pmovsxdq", "pmovzxdq", "insertps", "extractps", "crc32",
}
MASK_OPS = re.compile(r"^k(mov|and|andn|or|xor|xnor|not|shift|ortest|test|unpck|add)")


def extended(mnemonic):
    return ((mnemonic.startswith("v") and mnemonic not in ("verr", "verw")) or mnemonic in EXTENDED or
            MASK_OPS.match(mnemonic) is not None)


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True, text=True).stdout
    return out.splitlines()


def main():
    variant = sys.argv[1]
    objects = [o for arg in sys.argv[2:] for o in arg.split(";") if o]
    if not objects:
        print(f"variant {variant}: no object files given", file=sys.stderr)
        return 1
    own = (f"pstar::kernels::cpu_{variant}::", f"pstar::kernels::isa_{variant}::")
    bad, weak_checked, functions = [], 0, 0
    for obj in objects:
        symbols = []
        nm = subprocess.run(["nm", "--defined-only", obj], check=True, capture_output=True, text=True).stdout
        for line in nm.splitlines():
            parts = line.split()
            if len(parts) == 3 and not (parts[1].islower() and parts[1] not in "uvw"):
                symbols.append((parts[1], parts[2]))
        names = demangle([s for _, s in symbols])
        weak_foreign = set()
        for (kind, mangled), name in zip(symbols, names):
            if name.startswith(own):
                continue
            # The EH personality's reference, the sanitizers' globals, and the
            # lock of Clang's OpenMP reductions: data, no code.
            if name.startswith(("DW.ref.", "__odr_asan", "__asan", "__sancov", ".gomp_critical_user_")):
                continue
            if kind in "WwVvu":
                weak_foreign.add(mangled)
            else:
                bad.append(f"{obj}: {kind} {name}: a strong symbol outside the variant's namespaces")
        # The weak copies' code: baseline instructions only.
        current = None
        asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj], check=True, capture_output=True,
                             text=True).stdout
        for line in asm.splitlines():
            m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
            if m:
                current = m.group(1) if m.group(1) in weak_foreign else None
                if current:
                    weak_checked += 1
                continue
            if current is None:
                continue
            fields = line.split("\t")
            if len(fields) < 2 or not fields[1].strip():
                continue
            mnemonic = fields[1].split()[0]
            if extended(mnemonic):
                bad.append(f"{obj}: {demangle([current])[0]}: '{fields[1].strip()}' is not baseline x86-64")
                current = None  # one line per copy
        functions += len(symbols)
    if bad:
        print(f"variant {variant}:", file=sys.stderr)
        print("\n".join(bad[:40]), file=sys.stderr)
        return 1
    print(f"variant {variant}: {functions} global symbols in {len(objects)} objects; "
          f"{weak_checked} weak copies of library code, all baseline x86-64")
    return 0


if __name__ == "__main__":
    sys.exit(main())

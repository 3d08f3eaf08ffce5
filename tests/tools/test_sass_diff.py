"""CPU tests of tools/sass_diff.py, the SASS comparer of two commits: listing splitting,
normalization, name matching, ptxas parsing, the table, and the two source layouts, all on
synthetic text and trees (nothing is compiled here)."""

import shutil
import textwrap
from pathlib import Path

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
sd = load_script(ROOT / "tools" / "sass_diff.py", "sass_diff")

ENC = "/* 0x000fe20000000800 */"


def listing(functions: dict[str, list[str]], base: int = 0, pad: int = 27) -> str:
    """A cuobjdump -sass listing of the given functions (name -> instructions), with addresses
    counted from `base` and encodings that depend on the address, so they differ between calls
    with different bases."""
    out = ["", "\tcode for sm_90a", "\t.target\tsm_90a", ""]
    for name, insts in functions.items():
        out += [f"\t\tFunction : {name}", '\t.headerflags\t@"EF_CUDA_ACCELERATORS EF_CUDA_SM90"']
        for i, inst in enumerate(insts):
            addr = base + 16 * i
            out.append(f"        /*{addr:04x}*/{' ' * pad}{inst} ;   /* 0x{addr:016x} */")
            out.append(f"{' ' * 100}{ENC}")
        out += ["\t\t..........", "", ""]
    return "\n".join(out)


BODY = ["LDC R1, c[0x0][0x28]", "S2R R24, SR_CTAID.X", "@!P0 BRA 0x40", "EXIT", "BRA 0x40"]


def test_split_functions_keys_each_function_by_its_mangled_name():
    text = listing({"_Z3fooPf": BODY, "_Z3barv": BODY[:2]})
    funcs = sd.split_functions(text)
    assert list(funcs) == ["_Z3fooPf", "_Z3barv"]
    assert len(sd.normalize_body(funcs["_Z3fooPf"])) == 5
    assert sd.normalize_body(funcs["_Z3barv"]) == [b + " ;" for b in BODY[:2]]


def test_normalize_line_drops_address_encoding_and_extra_spaces():
    line = "        /*0420*/              @!P0 BRA 0x4d0 ;          /* 0x0000000000288947 */"
    assert sd.normalize_line(line) == "@!P0 BRA 0x4d0 ;"
    assert sd.normalize_line("   /*0e50*/   NOP;    /* 0x0000000000007918 */") == "NOP;"
    assert sd.normalize_line("   HMMA.16816.F32   R0,  R2,  R4, R0 ;") is None  # no address
    # encoding-only continuation lines, headers and separators hold no instruction
    assert sd.normalize_line(" " * 90 + "/* 0x000fc00000000000 */") is None
    assert sd.normalize_line('\t.headerflags\t@"EF_CUDA_SM90"') is None
    assert sd.normalize_line("\t\t..........") is None


def test_bodies_differing_only_in_addresses_and_encodings_are_equal():
    a = sd.split_functions(listing({"_Z1kv": BODY}, base=0, pad=10))["_Z1kv"]
    b = sd.split_functions(listing({"_Z1kv": BODY}, base=0x100, pad=30))["_Z1kv"]
    assert a != b  # the raw text differs (addresses, encodings, spacing) ...
    assert sd.normalize_body(a) == sd.normalize_body(b)  # ... the normalized bodies do not


def test_a_changed_opcode_or_branch_target_is_a_difference():
    base = sd.normalize_body(sd.split_functions(listing({"k": BODY}))["k"])
    opcode = BODY[:1] + ["S2UR UR4, SR_CTAID.X"] + BODY[2:]
    target = BODY[:2] + ["@!P0 BRA 0x50"] + BODY[3:]
    for changed in (opcode, target):
        body = sd.normalize_body(sd.split_functions(listing({"k": changed}))["k"])
        assert body != base


def test_canonical_name_drops_the_moved_namespaces():
    old = "void fa4::sm90::fwd_kernel<fa4::sm90::GmemView<cutlass::bfloat16_t> >(int)"
    new = "void fa4::fwd_kernel<fa4::GmemView<cutlass::bfloat16_t>>(int)"
    assert sd.canonical_name(old) == sd.canonical_name(new)
    assert sd.canonical_name(old) == "void fwd_kernel<GmemView<cutlass::bfloat16_t>>(int)"
    assert sd.canonical_name("fa4::sm100::X<sm90::Y>") == "X<Y>"
    # other namespaces and different template arguments stay apart
    assert sd.canonical_name("cute::X<1>") != sd.canonical_name("X<1>")
    assert sd.canonical_name("fa4::X<96>") != sd.canonical_name("fa4::X<128>")
    assert sd.canonical_name("myfa4::X") == "myfa4::X"


def test_short_name_drops_return_type_parameters_and_library_namespaces():
    name = "void bwd_kernel<BwdTraits<96, 96, cutlass::half_t>>(BwdKernelParams<(int)3>)"
    assert sd.short_name(name) == "bwd_kernel<BwdTraits<96, 96, half_t>>"
    long = sd.short_name("k<" + ", ".join(["cute::C<128>"] * 40) + ">", width=60)
    assert len(long) == 60 and "…" in long and long.startswith("k<C<128>")


def kernel(mangled, canonical, body):
    return {"mangled": mangled, "canonical": canonical, "body": list(body)}


def test_match_by_name_then_by_body():
    old = [
        kernel("_Z1a", "void fwd<GmemView>()", BODY),
        kernel("_Z1b", "void renamed_old()", BODY[:3]),
        kernel("_Z1c", "void gone()", ["EXIT"]),
    ]
    new = [
        kernel("_Z2a", "void fwd<GmemView>()", BODY[:4]),
        kernel("_Z2b", "void renamed_new()", BODY[:3]),
        kernel("_Z2d", "void added()", ["NOP", "EXIT"]),
    ]
    pairs = {
        (a and a["mangled"], b and b["mangled"], note) for a, b, note in sd.match_kernels(old, new)
    }
    assert pairs == {
        ("_Z1a", "_Z2a", ""),
        ("_Z1b", "_Z2b", "matched by body"),
        ("_Z1c", None, ""),
        (None, "_Z2d", ""),
    }


def test_compare_statuses_and_table():
    old = {"90a": [kernel("_Z1a", "void fwd<A>()", BODY), kernel("_Z1b", "void bwd()", BODY)]}
    new = {"90a": [kernel("_Z2a", "void fwd<A>()", BODY), kernel("_Z2b", "void bwd()", BODY[:4])]}
    new["90a"].append(kernel("_Z2c", "void extra()", ["EXIT"]))
    old["90a"][0]["registers"] = new["90a"][0]["registers"] = 168
    rows = sd.compare(old, new)
    assert {r.name: r.status for r in rows} == {
        "fwd<A>": "same",
        "bwd": "changed",
        "extra": "only-new",
    }
    table = sd.format_table(rows)
    assert "summary: 1 same, 1 changed, 0 only-old, 1 only-new" in table
    assert "-BRA 0x40" in table  # the changed kernel's diff: its last instruction is gone
    fwd = next(line for line in table.splitlines() if line.startswith("fwd<A>"))
    assert fwd.split()[1:7] == ["90a", "5", "5", "168", "168", "same"]
    # only identical bodies everywhere count as unchanged
    same = sd.compare(
        old, {"90a": [kernel("x", "void fwd<A>()", BODY), kernel("y", "void bwd()", BODY)]}
    )
    assert all(r.status == "same" for r in same)


def test_body_diff_is_truncated():
    old = [f"IADD3 R{i}, R{i}, 0x1, RZ ;" for i in range(50)]
    new = [line.replace("0x1", "0x2") for line in old]
    diff = sd.body_diff(old, new, max_lines=6)
    assert len(diff) == 7 and diff[-1].startswith("... (") and diff[0].startswith("@@")


PTXAS = textwrap.dedent("""\
    ptxas info    : 0 bytes gmem
    ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90a'
    ptxas info    : Function properties for _Z1kPf
        56 bytes stack frame, 136 bytes spill stores, 152 bytes spill loads
    ptxas info    : Used 168 registers, used 16 barriers, 56 bytes cumulative stack size
    ptxas info    : Compile time = 298.779 ms
    ptxas info    : Compiling entry function '_Z1gv' for 'sm_90a'
    ptxas info    : Function properties for _Z1gv
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 34 registers, used 1 barriers
""")


def test_parse_ptxas_registers_and_spills():
    info = sd.parse_ptxas(PTXAS)
    assert info["_Z1kPf"] == {
        "registers": 168,
        "stack": 56,
        "spill_stores": 136,
        "spill_loads": 152,
    }
    assert info["_Z1gv"]["registers"] == 34 and info["_Z1gv"]["spill_stores"] == 0


def test_symbol_references_are_compared_by_canonical_name():
    body = ["CALL.REL.NOINC `(_ZN3fa44sm906helperEv) ;", "RET.REL.NODEC R20 0x0 ;"]
    assert sd.symbol_refs(body) == {"_ZN3fa44sm906helperEv"}
    out = sd.canonicalize_refs(body, {"_ZN3fa44sm906helperEv": "helper()"})
    assert out == ["CALL.REL.NOINC `(helper()) ;", body[1]]


def test_demangle_with_and_without_a_demangler(monkeypatch):
    mangled = "_ZN3fa44sm9010bwd_kernelINS0_8GmemViewEEEvv"
    if shutil.which("cu++filt") or shutil.which("c++filt"):
        got = sd.demangle([mangled])[mangled]
        assert got == "void fa4::sm90::bwd_kernel<fa4::sm90::GmemView>()"
        moved = sd.demangle(["_ZN3fa410bwd_kernelINS_8GmemViewEEEvv"])
        assert sd.canonical_name(got) == sd.canonical_name(next(iter(moved.values())))
    monkeypatch.setattr(sd.shutil, "which", lambda name: None)
    assert sd.demangle([mangled]) == {mangled: mangled}


def touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_legacy_layout_units_and_flags(tmp_path):
    csrc = tmp_path / "tree" / "csrc"
    for name in (
        "fwd_sm90_hd96.cu",
        "fwd_sm90_hd96_fp16.cu",
        "bwd_sm90_hd96.cu",
        "fwd_sm90_hd128.cu",
        "fwd_sm90_hd192x128_fp16.cu",
        "bwd_sm90_hd192x128.cu",
        "fwd_sm90.cu",
        "bwd_sm90.cu",
        "fwd_sm100.cu",
        "bwd_sm100.cu",
        "dispatch.cu",
    ):
        touch(csrc / name)
    units = sd.legacy_units(tmp_path / "tree", ["90a"], ["96", "192x128"])
    assert sorted(p.name for _, p in units) == [
        "bwd_sm90_hd192x128.cu",
        "bwd_sm90_hd96.cu",
        "fwd_sm90_hd192x128_fp16.cu",
        "fwd_sm90_hd96.cu",
        "fwd_sm90_hd96_fp16.cu",
    ]
    assert {a for a, _ in units} == {"90a"}
    units = sd.legacy_units(tmp_path / "tree", ["100a"], ["96"])
    assert sorted((a, p.name) for a, p in units) == [
        ("100a", "bwd_sm100.cu"),
        ("100a", "fwd_sm100.cu"),
    ]
    p = sd.plan("0" * 40, tmp_path, ["90a", "100a"], ["96", "192x128"], None)
    assert p.layout == "legacy" and len(p.units) == 7
    assert p.flags[: len(sd.LEGACY_FLAGS)] == sd.LEGACY_FLAGS
    assert "-DFA4_HDIM_96" in p.flags and "-DFA4_HDIM_192X128" in p.flags
    assert "-DFA4_HDIM_128" not in p.flags and "-DFA4_HAS_SM100_BWD" in p.flags
    assert p.includes == [str(tmp_path / "tree" / "csrc")]
    assert p.base == sd.LEGACY_FLAGS


MANIFEST = """
from pathlib import Path

def generate_sources(out_dir, archs, hdims):
    out_dir = Path(out_dir)
    (out_dir / "fa4_instances.h").write_text("// instances\\n")
    units = []
    for arch in archs:
        for h in hdims:
            path = out_dir / f"fwd_sm{arch}_hd{h}.cu"
            path.write_text('#include "fa4_instances.h"\\n')
            units.append((arch, path))
    return units

def nvcc_flags():
    return ["-O3", "--use_fast_math", "-DFA4_FROM_MANIFEST"]
"""


@pytest.mark.parametrize("base", [None, ["-O2", "-std=c++20"]])
def test_manifest_layout_units_and_flags(tmp_path, base):
    tree = tmp_path / "tree"
    touch(tree / "fa4" / "manifest.py", MANIFEST)
    p = sd.plan("1" * 40, tmp_path, ["90a"], ["64", "192x128"], base)
    assert p.layout == "manifest"
    assert [(u.arch, u.label) for u in p.units] == [
        ("90a", "gen/fwd_sm90a_hd64.cu"),
        ("90a", "gen/fwd_sm90a_hd192x128.cu"),
    ]
    assert all(u.src.exists() for u in p.units)
    assert (tmp_path / "gen" / "fa4_instances.h").exists()
    assert p.includes == [str(tree / "csrc"), str(tmp_path / "gen")]
    if base is None:  # its own flags, -std added
        assert p.flags == ["-O3", "--use_fast_math", "-DFA4_FROM_MANIFEST", "-std=c++17"]
    else:  # the other commit's flags, no legacy defines
        assert p.flags == base


def test_cache_key_depends_on_commit_archs_hdims_and_flags(tmp_path):
    touch(tmp_path / "tree" / "csrc" / "fwd_sm100.cu")
    p = sd.plan("2" * 40, tmp_path, ["100a"], ["96"], None)
    key = sd.cache_key(p, ["100a"], ["96"], "nvcc 13.0")
    assert key == sd.cache_key(p, ["100a"], ["96"], "nvcc 13.0")
    assert key.startswith("2" * 12)
    assert key != sd.cache_key(p, ["100a"], ["96", "128"], "nvcc 13.0")
    assert key != sd.cache_key(p, ["90a", "100a"], ["96"], "nvcc 13.0")
    p.flags = [*p.flags, "-DFA4_TRACE"]
    assert key != sd.cache_key(p, ["100a"], ["96"], "nvcc 13.0")


def test_dump_directory_round_trip(tmp_path):
    k = kernel("_ZN3fa44sm903fwdEv", "void fwd()", BODY)
    k.update(arch="90a", unit="csrc/fwd_sm90_hd96.cu", demangled="void fa4::sm90::fwd()")
    k["registers"] = 168
    record = {"commit": "3" * 40, "layout": "legacy", "archs": ["90a"], "hdims": ["96"],
              "flags": ["-O3", "-DFA4_HDIM_96"], "base_flags": ["-O3"], "units": [],
              "kernels": {"90a": [k]}}  # fmt: skip
    sd.write_dump(record, tmp_path / "dump")
    assert sd.load_record(tmp_path / "dump" / "sass.json.gz") == record
    assert sd.flags_of(str(tmp_path / "dump"), tmp_path) == ["-O3"]
    index = (tmp_path / "dump" / "index.tsv").read_text().splitlines()
    assert len(index) == 2 and index[1].split("\t")[2:4] == ["5", "168"]
    sass = tmp_path / "dump" / index[1].split("\t")[1]
    assert sass.read_text().splitlines() == BODY

"""CPU test of tools/ncu_source_summary.py on a small source page in the layout that
`ncu --page source --csv --print-source sass` writes (kernel row, header row, one row per
instruction; the columns it does not read are left out)."""

from pathlib import Path

from helpers import load_script

ns = load_script(
    Path(__file__).resolve().parents[2] / "tools" / "ncu_source_summary.py", "ncu_source_summary"
)

PAGE = """\
"Kernel Name","void k<int>(int)",
"Address","Source","Warp Stall Sampling (All Samples)",\
"stall_barrier","stall_long_sb","stall_wait","stall_barrier (Not Issued)"
"0x7f0000002800","      LDC R1, c[0x0][0x28]","10","0","0","10","0"
"0x7f0000002810","      WARPGROUP.DEPBAR.LE gsb0, 0x0","60","55","0","5","55"
"0x7f0000002820","      FENCE.VIEW.ASYNC.S","30","0","30","0","0"
"0x7f0000002830","      EXIT","-","-","-","-","-"
"""


def test_summary_ranks_sites_and_reasons(tmp_path):
    page = tmp_path / "page.csv"
    page.write_text(PAGE)
    lines = ns.summarize(str(page), top=2).splitlines()
    assert lines[0] == "void k<int>(int)"
    assert lines[1] == "samples 100"
    # Reasons over the kernel, most first; the "(Not Issued)" columns are not counted again.
    assert lines[2].split()[:3] == ["barrier", "55", "55.0"]
    assert lines[3].split()[:3] == ["long_sb", "30", "30.0"]
    assert lines[4].split()[:3] == ["wait", "15", "15.0"]
    sites = [ln for ln in lines if ln.startswith("  0x")]
    # Offsets from the first instruction, as cuobjdump numbers them; only the top two sites.
    assert [s.split()[0] for s in sites] == ["0x00010", "0x00020"]
    assert "DEPBAR" in sites[0] and "60.00 %" in sites[0] and "barrier 55" in sites[0]


CENSUS = """\
"Kernel Name","void k<int>(int)",
"Address","Source","Instructions Executed","Warp Stall Sampling (All Samples)"
"0x7f0000002800","      UIADD3 UR4, UR4, 0x2, URZ","100","1"
"0x7f0000002810","      @!P1 UIADD3.X UR5, UR5, URZ, URZ, UP0, !UPT","40","0"
"0x7f0000002820","      HGMMA.64x64x16.F32.BF16 R184, gdesc[UR20], R184","100","3"
"0x7f0000002830","      UTMALDG.2D [UR8], [UR10]","7","0"
"0x7f0000002840","      EXIT","-","-"
"""


def test_opcode_census_counts_executed_per_opcode(tmp_path):
    page = tmp_path / "census.csv"
    page.write_text(CENSUS)
    name, counts = ns.opcode_census(str(page))
    assert name == "void k<int>(int)"
    # Predicates and modifiers dropped; rows without a count (never executed) left out.
    assert counts == {"UIADD3": 140, "HGMMA": 100, "UTMALDG": 7}
    text = ns.format_census(name, counts, top=5)
    # TMA instructions are not the uniform datapath's arithmetic.
    assert "executed 247  uniform datapath 140" in text
    # Offsets from the first instruction, both ends included.
    assert ns.opcode_census(str(page), 0x10, 0x20)[1] == {"UIADD3": 40, "HGMMA": 100}

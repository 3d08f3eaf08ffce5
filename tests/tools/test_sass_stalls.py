"""CPU tests of tools/sass_stalls.py on lines of a real sm_90a listing (the hd128 forward's softmax:
a MUFU.EX2 that sets scoreboard 2 and a row-sum FADD that waits 7 cycles on scoreboard 3)."""

from pathlib import Path

from helpers import load_script

ss = load_script(Path(__file__).resolve().parents[2] / "tools" / "sass_stalls.py", "sass_stalls")

LISTING = """
\t\tFunction : _Z6kernelI6bf16_tEvv
\t.headerflags\t@"EF_CUDA_SM90"
        /*7430*/                   MUFU.EX2 R107, R107 ;                   /* 0x0000006b006b7308 */
                                                                           /* 0x000ea20000000800 */
        /*7440*/                   FADD.FTZ R22, R22, R105 ;               /* 0x0000006916167221 */
                                                                           /* 0x008fce0000010000 */
        /*7450*/              @!P4 FMUL.FTZ R16, R16, R19 ;                /* 0x0000001310104220 */
                                                                           /* 0x008fce0000010000 */
\t\tFunction : _Z6kernelI6half_tEvv
        /*0000*/                   EXIT ;                                  /* 0x000000000000794d */
                                                                           /* 0x000fea0003800000 */
"""


def test_control_fields_of_known_instructions():
    mufu = ss.decode_control(0x000EA20000000800)
    assert (mufu["stall"], mufu["yield_"], mufu["write_barrier"]) == (1, 1, 2)
    assert (mufu["read_barrier"], mufu["wait_mask"], mufu["reuse"]) == (7, 0, 0)
    fadd = ss.decode_control(0x008FCE0000010000)
    assert (fadd["stall"], fadd["write_barrier"], fadd["wait_mask"]) == (7, 7, 0b001000)


def test_listing_parse_select_and_summary():
    fns = ss.functions(LISTING)
    assert list(fns) == ["_Z6kernelI6bf16_tEvv", "_Z6kernelI6half_tEvv"]
    ins = fns["_Z6kernelI6bf16_tEvv"]
    assert [(x.addr, x.opcode, x.stall) for x in ins] == [
        (0x7430, "MUFU", 1),
        (0x7440, "FADD", 7),
        (0x7450, "FMUL", 7),
    ]
    assert ins[2].text.startswith("@!P4 FMUL.FTZ")
    assert [x.addr for x in ss.select(ins, 0x7430, 0x7450, [(0x7430, 0x7450)])] == [0x7430, 0x7450]
    out = ss.summary(ss.select(ins, 0x7430, 0x7440, []))
    assert (
        out.splitlines()[0]
        == "2 instructions, stall counts sum to 8 cycles, 1 wait on a scoreboard"
    )
    assert "FADD             1      7" in out
    assert fns["_Z6kernelI6half_tEvv"][0].opcode == "EXIT"

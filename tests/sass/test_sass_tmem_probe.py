"""The tcgen05 helpers of csrc/tmem.cuh in sm_100a SASS, through tests/cpp/tmem_probe_sm100.cu (a
never-launched kernel that walks the forward's TMEM plan at hd 64, 128, 192 and 256): compiled
with the build's flags, they are the TMEM instructions (alloc, ld, st) and use no local memory.
The plans themselves: tests/models/test_tmem_plan.py.

Compiled, not executed: no Blackwell GPU is available.
"""

import pytest
from sass_helpers import compile_ahead, compile_cubin, entries

pytestmark = pytest.mark.build
PROBE = "tests/cpp/tmem_probe_sm100.cu"
compile_ahead(__name__, cubins=[(PROBE, "100a")])


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return compile_cubin(tmp_path_factory, PROBE, arch="100a")


@pytest.mark.parametrize(
    "op, why",
    [
        ("UTCATOMSWS", "tcgen05.alloc / dealloc"),
        ("LDTM.x32", "tcgen05.ld of 32 columns (S and O chunks)"),
        ("STTM.x16", "tcgen05.st of a 16-bit P chunk"),
        ("STTM.x32", "tcgen05.st of a rescaled O chunk"),
    ],
)
def test_probe_sass_has(probe, op, why):
    assert op in probe[1], f"{op} missing: {why}"


def test_probe_uses_no_local_memory(probe):
    report = entries(probe[0], "100a")
    assert len(report) == 4, probe[0]
    for name, e in report.items():
        assert e["stack"] == 0 and e["spill_stores"] == 0, (name, e)

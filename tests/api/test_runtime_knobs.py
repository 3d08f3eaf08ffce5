"""dispatch.runtime_knobs: the environment variables that steer the compiled ops, read in Python
at each call and passed to fa4::_fwd_kernel / _bwd_kernel as arguments (the C++ code reads none
of them per call; Note [stream tile counter] in csrc/api/bindings.cpp, Note [tile order options]
in csrc/common/tile_scheduler.cuh). CPU only: the ops' callers are checked with a stand-in op
against the schemas that csrc/api/bindings.cpp declares."""

import re
from pathlib import Path

import pytest
import torch

from fa4 import _ops, dispatch

ROOT = Path(__file__).resolve().parents[2]
KNOBS = ("FA4_NUM_SMS", "FA4_STATIC_SCHEDULE", "FA4_FRESH_TILE_COUNTER", "FA4_TILE_ORDER",
         "FA4_BWD_TILE_ORDER")  # fmt: skip


@pytest.fixture
def env(monkeypatch):
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_unset_is_every_sm_the_stream_counter_and_the_default_order(env):
    assert dispatch.runtime_knobs("fwd") == (0, 0, "")
    assert dispatch.runtime_knobs("bwd") == (0, 0, "")
    env.setenv("FA4_NUM_SMS", "")  # empty counts as unset
    assert dispatch.runtime_knobs("fwd") == (0, 0, "")


def test_each_variable_is_read_at_each_call(env):
    env.setenv("FA4_NUM_SMS", "3")
    env.setenv("FA4_TILE_ORDER", "first,wave")
    env.setenv("FA4_BWD_TILE_ORDER", "l2,first")
    assert dispatch.runtime_knobs("fwd") == (3, 0, "first,wave")
    assert dispatch.runtime_knobs("bwd") == (3, 0, "l2,first")
    env.setenv("FA4_FRESH_TILE_COUNTER", "1")
    assert dispatch.runtime_knobs("fwd")[1] == 2
    env.setenv("FA4_STATIC_SCHEDULE", "1")  # static wins: no counter at all
    assert dispatch.runtime_knobs("fwd")[1] == 1
    env.setenv("FA4_STATIC_SCHEDULE", "0")  # only "1" switches, as the C++ glue did
    env.setenv("FA4_FRESH_TILE_COUNTER", "yes")
    assert dispatch.runtime_knobs("bwd")[1] == 0
    env.delenv("FA4_NUM_SMS")
    assert dispatch.runtime_knobs("fwd")[0] == 0


def test_tile_order_text_is_passed_as_it_is(env):
    """The C++ API judges the text (and names the variable in its error), so Python neither
    checks nor changes it."""
    env.setenv("FA4_TILE_ORDER", "first,bogus")
    assert dispatch.runtime_knobs("fwd")[2] == "first,bogus"
    assert dispatch.runtime_knobs("bwd")[2] == ""


@pytest.mark.parametrize("text", ["abc", "3x", "-1", "1.5", str(2**31)])
def test_bad_num_sms_names_the_variable(env, text):
    env.setenv("FA4_NUM_SMS", text)
    with pytest.raises(ValueError, match=f"FA4_NUM_SMS: .*got {re.escape(repr(text))}"):
        dispatch.runtime_knobs("fwd")


def _schema(op: str) -> torch._C.FunctionSchema:
    """The schema csrc/api/bindings.cpp declares for fa4::<op> (m.def's string literals)."""
    src = (ROOT / "csrc" / "api" / "bindings.cpp").read_text()
    for call in re.findall(r'm\.def\(\s*((?:"[^"]*"\s*)+)\);', src):
        text = "".join(re.findall(r'"([^"]*)"', call))
        if text.startswith(f"{op}("):
            return torch._C.parse_schema(f"fa4::{text}")
    raise AssertionError(f"no m.def of {op} in csrc/api/bindings.cpp")


class _Spy:
    """Stands in for torch.ops.fa4 (not built on a CPU machine): records each kernel op's
    arguments."""

    def __init__(self):
        self.calls = {}

    def _fwd_kernel(self, *args):
        self.calls["_fwd_kernel"] = args
        return "out", "lse"

    def _bwd_kernel(self, *args):
        self.calls["_bwd_kernel"] = args
        return "dq", "dk", "dv"


def test_ops_pass_the_knobs_in_schema_order(env, monkeypatch):
    """_fwd_cuda / _bwd_cuda (every path to the kernels: the op, Note [inference fast path] and
    Note [eager autograd path]) append the knobs as the schemas' last three arguments."""
    spy = _Spy()
    monkeypatch.setattr(torch.ops, "fa4", spy)
    monkeypatch.setattr(dispatch, "kernel_for", lambda *a, **kw: "sm90")
    env.setenv("FA4_NUM_SMS", "5")
    env.setenv("FA4_STATIC_SCHEDULE", "1")
    env.setenv("FA4_TILE_ORDER", "wave")
    env.setenv("FA4_BWD_TILE_ORDER", "l2")
    q = torch.zeros(1, 8, 2, 64)
    opts = (True, 0.125, -1, 0, 0.0, False, "auto")
    assert _ops._fwd_cuda(q, q, q, None, None, None, 0, 0, *opts) == ("out", "lse")
    assert _ops._bwd_cuda(q, q, q, q, q, q, None, None, None, None, 0, 0, *opts)[0] == "dq"
    for op, field, order in (("_fwd_kernel", "tile_order", "wave"),
                             ("_bwd_kernel", "bwd_tile_order", "l2")):  # fmt: skip
        args, schema = spy.calls[op], _schema(op)
        names = [a.name for a in schema.arguments]
        assert len(args) == len(names), (op, names)
        at = names.index("num_sms")  # the knobs, then (fwd) the FP8 cache's descales
        assert names[at : at + 3] == ["num_sms", "tile_schedule", field], names
        assert str(schema.arguments[at + 2].type) == "Optional[str]"
        assert args[at : at + 3] == (5, 1, order), op
        assert args[names.index("deterministic")] is False and args[names.index("causal")] is True

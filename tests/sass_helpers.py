"""The SASS tests' compiler (tests/sass): kernel instances compiled as the build compiles them,
their ptxas reports and SASS, and the table of the thresholds those tests hold them to.

compile_instance compiles one instance of the kernel manifest (fa4/kernels.json): the
translation unit fa4/manifest.py generates for it, with the build's nvcc flags
(manifest.nvcc_flags(), what setup.py and CMakeLists.txt pass) and one -gencode, to a cubin
(`nvcc -cubin -Xptxas=-v`), whose SASS cuobjdump prints. Each (instance, defines, arch) compiles
once per pytest run. Without nvcc, cuobjdump or nvdisasm the calling test skips with the reason.

The numbers the SASS tests pin (spill bytes, instruction counts used as bounds) depend on the
compiler: THRESHOLDS holds them per nvcc major.minor, and threshold() fails on an nvcc the table
has no row for (docs/testing.md, "SASS thresholds", says how to re-derive one).
"""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache, partial
from pathlib import Path

import pytest
from helpers import ROOT, find_tool

from fa4 import manifest

# The arch each kernel family is compiled for: its arch among the build's defaults (90a, 100a).
FAMILY_ARCH = {manifest.ARCHS[a]: a for a in reversed(manifest.M["default_archs"])}
# Portable families (kernels.json "portable": the decode kernel) compile for every arch; their
# instances' default arch is the first default one (sm_90a, the one that runs them).
FAMILY_ARCH |= {f: manifest.M["default_archs"][0] for f in manifest.M.get("portable", [])}

# Pinned SASS numbers per nvcc major.minor: bounds on what ptxas and the SASS of the instances
# compile_instance builds show (the tests' docstrings say where each comes from). Names:
# <family>_<direction>[_hd<head dim>]_<what>[_min|_max]; without _min / _max, an exact value.
THRESHOLDS: dict[str, dict[str, int]] = {
    "13.0": {
        # SM90 forward (test_sass_sm90.py). hd 64, three consumers: the producer's spills (its
        # 32 registers hold the scheduler's values around the tile claims); hd 64, three-CTA
        # kernel: registers at launch (__launch_bounds__(256, 3)); hd 256: both block widths.
        "sm90_fwd_hd64_spill_bytes_max": 72,
        "sm90_fwd_hd64_3cta_registers": 80,
        "sm90_fwd_hd256_spill_bytes_max": 24,
        # SM90 backward: spill stores (the producer warpgroup's; hd 256 is the split variant),
        # and counts in the bf16 kernel between its first and last HGMMA (hd 128 unless named):
        # R2UR moves, 64-bit descriptor steps (a minimum), rematerialized descriptor high words,
        # local loads, LEA.HI of signed divisions (hd 64 and 128), the masked no-softcap path's
        # instructions, wgmma waits (every variant).
        "sm90_bwd_hd128_spill_bytes_max": 136,
        "sm90_bwd_hd256_spill_bytes_max": 180,
        "sm90_bwd_hd128_loop_r2ur_max": 4,
        "sm90_bwd_hd128_loop_uiadd3_64_min": 40,
        "sm90_bwd_hd128_loop_umov_hi_max": 30,
        "sm90_bwd_hd128_loop_ldl_max": 4,
        "sm90_bwd_loop_lea_hi_max": 2,
        "sm90_bwd_hd128_masked_path_instructions_max": 299,
        "sm90_bwd_wgmma_waits_max": 10,
        # SM100 forward: spill stores per kernel, every head dim (test_sass_sm100.py::
        # test_spills_bounded); 44 at hd 128, none of them in a per-block loop
        # (test_sass_sm100_spills.py).
        "sm100_fwd_spill_bytes_max": 44,
        # SM100 2-CTA forward (hd 192, 256): no spill at all (test_sass_sm100_fwd_2cta.py).
        "sm100_fwd_2cta_spill_bytes_max": 0,
        # SM100 backward, 1-CTA kernel at hd 64 and 96: two scalars saved at entry.
        "sm100_bwd_spill_bytes_max": 8,
        # SM100 backward, 2-CTA kernel (hd 128): scalars saved once per kernel, none in a
        # per-block loop (test_sass_sm100_spills.py).
        "sm100_bwd_2cta_spill_bytes_max": 20,
        # SM100 backward, head-dim split (hd 192, (192, 128), 256): a scalar saved at entry.
        "sm100_bwd_split_spill_bytes_max": 4,
    },
}


def nvcc_version() -> str:
    """nvcc's major.minor ("13.0"); skips the calling test without nvcc."""
    return _nvcc_version(find_tool("nvcc"))


@cache
def _nvcc_version(nvcc: str | None) -> str:
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, nvidia-* wheels, CUDA_HOME): no SASS to hold")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    assert m, f"no 'release X.Y' in `{nvcc} --version`:\n{out}"
    return m.group(1)


def threshold(name: str) -> int:
    """THRESHOLDS' value of `name` for this nvcc (or for the nvcc FA4_SASS_THRESHOLDS_NVCC names:
    a recorded row held against another compiler, to see which numbers moved); fails on an nvcc
    the table has no row for."""
    version = os.environ.get("FA4_SASS_THRESHOLDS_NVCC") or nvcc_version()
    row = THRESHOLDS.get(version)
    if row is None:
        recorded = ", ".join(sorted(THRESHOLDS))
        pytest.fail(
            f"SASS thresholds were recorded with nvcc {recorded}; this is nvcc {version}: "
            "re-derive them (docs/testing.md, 'SASS thresholds') and add a row to "
            "tests/sass_helpers.py's THRESHOLDS"
        )
    assert name in row, f"no threshold {name!r} for nvcc {version} in tests/sass_helpers.py"
    return row[name]


def cutlass_include() -> str:
    """CUTLASS's include folder from the nvidia-cutlass wheel (setup.py's find_cutlass_include)."""
    import cutlass_library

    return str(Path(cutlass_library.source_path) / "include")


def _tools() -> tuple[str, str, str]:
    nvcc, cuobjdump, nvdisasm = (find_tool(t) for t in ("nvcc", "cuobjdump", "nvdisasm"))
    if None in (nvcc, cuobjdump, nvdisasm):
        pytest.skip(f"needs nvcc, cuobjdump, nvdisasm (found {nvcc}, {cuobjdump}, {nvdisasm})")
    return nvcc, cuobjdump, nvdisasm


def run_host_harness(tmp_path: Path, source: str) -> str:
    """Builds tests/cpp/<source>, a host program that uses CuTe's layouts (nvcc, no GPU needed
    to run it), runs it and returns its stdout; fails the test if it exits non-zero, skips it
    without nvcc."""
    nvcc = find_tool("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found: the harness needs CuTe's layouts compiled")
    exe = tmp_path / Path(source).stem
    subprocess.run(
        [nvcc, "-std=c++20", "-arch=sm_90a", f"-I{ROOT / 'csrc'}", f"-I{cutlass_include()}",
         str(ROOT / "tests/cpp" / source), "-o", str(exe)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def build_flags(arch: str, fast_math: bool = True) -> list[str]:
    """The build's nvcc flags for one arch (setup.py's _nvcc_flags without FA4_NVCC_EXTRA), with
    the kernel sources' and CUTLASS's include folders; fast_math=False drops --use_fast_math."""
    flags = [f for f in manifest.nvcc_flags() if fast_math or f != "--use_fast_math"]
    gencode = f"-gencode=arch=compute_{arch},code=sm_{arch}"
    return [*flags, gencode, f"-I{ROOT / 'csrc'}", f"-I{cutlass_include()}"]


# (source, extra, arch, fast_math) -> Future of (ptxas, sass), or of the failure's text
_COMPILED: dict[tuple, Future] = {}


def compile_cubin(tmp_path_factory, source, *extra, arch: str, fast_math: bool = True):
    """(ptxas -v report, cuobjdump -sass text) of `source` (a path, relative to the repository
    or absolute) compiled with build_flags(arch, fast_math) and `extra` flags (-D..., -I...).
    Once per pytest run for each (source, extra, arch, fast_math); a compile the background
    (compile_in_background) has not started yet runs here."""
    tools = _tools()
    job = _job(tmp_path_factory, tools, source, extra, arch, fast_math)
    if job.cancel():  # queued in the background, not started: compile it now
        job = _COMPILED[job.key] = _run_now(job.key, job.fn)
    got = job.result()
    if isinstance(got, str):
        pytest.fail(got)
    return got


def _job(tmp_path_factory, tools, source, extra, arch, fast_math, pool=None) -> Future:
    """The Future of one compile: the existing one, or a new one, run now (pool None) or queued
    in `pool`."""
    key = (str(ROOT / source), tuple(extra), arch, fast_math)
    if key not in _COMPILED:
        cubin = tmp_path_factory.mktemp("sass") / (Path(key[0]).stem + ".cubin")
        fn = partial(_compile, *tools, cubin, *key)
        _COMPILED[key] = _run_now(key, fn) if pool is None else pool.submit(fn)
        _COMPILED[key].key, _COMPILED[key].fn = key, fn
    return _COMPILED[key]


def _run_now(key, fn) -> Future:
    done = Future()
    done.key, done.fn = key, fn
    done.set_result(fn())
    return done


def _compile(nvcc, cuobjdump, nvdisasm, cubin, source, extra, arch, fast_math):
    cmd = [nvcc, "-cubin", source, "-o", str(cubin), *build_flags(arch, fast_math), *extra,
           "-Xptxas=-v"]  # fmt: skip
    build = subprocess.run(cmd, capture_output=True, text=True)
    if build.returncode != 0:
        return f"{' '.join(cmd)}\nfailed:\n{build.stderr[-4000:]}"
    # cuobjdump -sass runs nvdisasm, which the pip wheels put in a folder of its own
    env = {**os.environ, "NVDISASM_PATH": str(Path(nvdisasm).parent)}
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env)
    if sass.returncode != 0:
        return f"cuobjdump -sass {cubin} failed:\n{sass.stderr[-4000:]}"
    return build.stderr, sass.stdout


# ---- Compiling ahead: while the other tests run ---------------------------------------------

# test module name -> what its tests compile: ("instance", family, direction, hdim_name, dtype,
# arch or None) or ("cubin", source, arch, fast_math), in the order they ask for them
_AHEAD: dict[str, list[tuple]] = {}
_POOL: ThreadPoolExecutor | None = None


def compile_ahead(module: str, instances=(), cubins=()) -> None:
    """Declares, when a SASS test module is imported (collected), what its tests will compile:
    instances as (family, direction, hdim_name, dtype[, arch]) and other sources as (source,
    arch[, fast_math]), so that compile_in_background can compile them while other tests run."""
    jobs = _AHEAD.setdefault(module, [])
    jobs += [("instance", *i, None)[:6] for i in instances]
    jobs += [("cubin", *c, True)[:4] for c in cubins]


def compile_in_background(tmp_path_factory, modules) -> None:
    """Starts, in FA4_SASS_JOBS threads (default: this process's CPUs; 0: none), the compiles
    compile_ahead declared for `modules` (those with selected tests), in declaration order. Called
    once per pytest run (tests/conftest.py); without the CUDA tools it does nothing, and the tests
    skip as they would."""
    global _POOL
    jobs = [j for m in modules for j in _AHEAD.get(m, ())]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = int(os.environ.get("FA4_SASS_JOBS", cpus))
    tools = tuple(find_tool(t) for t in ("nvcc", "cuobjdump", "nvdisasm"))
    if not jobs or workers <= 0 or None in tools or _POOL is not None:
        return
    _POOL = ThreadPoolExecutor(workers, thread_name_prefix="sass")
    for kind, *args in jobs:
        if kind == "cubin":
            source, arch, fast_math = args
            _job(tmp_path_factory, tools, source, (), arch, fast_math, _POOL)
        else:
            family, direction, hdim_name, dtype, arch = args
            inst = instance(family, direction, hdim_name, dtype)
            folder = _generated(tmp_path_factory, inst)
            arch = arch or FAMILY_ARCH[family]
            _job(tmp_path_factory, tools, folder / inst.filename, (f"-I{folder}",), arch, True,
                 _POOL)  # fmt: skip


def stop_background() -> None:
    """Drops the compiles not yet started (the end of the run, or -x)."""
    if _POOL is not None:
        _POOL.shutdown(wait=False, cancel_futures=True)


def hdim_names(family: str, direction: str) -> list[str]:
    """The head dims (manifest.HEAD_DIMS keys) the manifest has for a kernel family and
    direction, in its order."""
    for k in manifest.M["kernels"]:
        if (k["family"], k["direction"]) == (family, direction):
            return list(k["head_dims"])
    raise KeyError((family, direction))


def instance(family: str, direction: str, hdim_name: str, dtype: str) -> manifest.Instance:
    """The manifest's instance of a kernel family and direction at a head dim (a key of
    manifest.HEAD_DIMS: "128", "192x128") and dtype ("bf16", "fp16")."""
    found = [
        i
        for i in manifest.instances([FAMILY_ARCH[family]], [hdim_name])
        if (i.family, i.direction, i.dtype) == (family, direction, dtype)
    ]
    assert len(found) == 1, f"the manifest has no {family} {direction} hd{hdim_name} {dtype}"
    return found[0]


def compile_instance(tmp_path_factory, family, direction, hdim_name, dtype, *extra_defines,
                     arch=None):  # fmt: skip
    """(ptxas -v report, SASS) of one kernel instance as the build compiles it: its generated
    translation unit (manifest.generate: the family's instance header and one FA4_INSTANCE_<DIR>
    line, beside fa4_instances.h) with the build's flags, for `arch` (default: the family's,
    FAMILY_ARCH; "90a" for an sm100 instance is the default multi-arch build's other pass).
    Once per pytest run for each (instance, extra_defines, arch)."""
    inst = instance(family, direction, hdim_name, dtype)
    folder = _generated(tmp_path_factory, inst)
    arch = arch or FAMILY_ARCH[family]
    return compile_cubin(
        tmp_path_factory, folder / inst.filename, f"-I{folder}", *extra_defines, arch=arch
    )


def instance_line_sass(tmp_path_factory, family, direction, hdim_name, dtype, *extra_defines,
                       arch=None) -> str:  # fmt: skip
    """`nvdisasm -gi` of compile_instance's cubin: the SASS with each instruction's inlining
    chain (file:line per frame, from the build's -lineinfo) and nvdisasm's SpillRefill marks
    (tools/spill_sites.py reads it)."""
    compile_instance(tmp_path_factory, family, direction, hdim_name, dtype, *extra_defines,
                     arch=arch)  # fmt: skip
    inst = instance(family, direction, hdim_name, dtype)
    folder = _generated(tmp_path_factory, inst)
    key = (str(ROOT / (folder / inst.filename)), (f"-I{folder}", *extra_defines),
           arch or FAMILY_ARCH[family], True)  # fmt: skip
    cubin = _COMPILED[key].fn.args[3]  # partial(_compile, nvcc, cuobjdump, nvdisasm, cubin, ...)
    nvdisasm = _tools()[2]
    out = subprocess.run([nvdisasm, "-gi", "-c", str(cubin)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


_GENERATED: dict[manifest.Instance, Path] = {}


def _generated(tmp_path_factory, inst: manifest.Instance) -> Path:
    if inst not in _GENERATED:
        folder = tmp_path_factory.mktemp(inst.filename.removesuffix(".cu"))
        manifest.generate(folder, [inst])
        _GENERATED[inst] = folder
    return _GENERATED[inst]


# ---- Reading ptxas reports and SASS ---------------------------------------------------------


def entries(ptxas: str, arch: str | None = None) -> dict[str, dict[str, int]]:
    """ptxas -v's report per entry function (mangled name): registers, stack frame, spill stores
    and spill loads in bytes; only those compiled for sm_<arch> when arch is given."""
    out = {}
    for chunk in ptxas.split("Compiling entry function '")[1:]:
        name, target = re.match(r"(\w+)' for 'sm_(\w+)'", chunk).groups()
        if arch is not None and target != arch:
            continue
        frame = re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", chunk
        )
        regs = re.search(r"Used (\d+) registers", chunk)
        assert frame and regs, chunk[:800]
        out[name] = {
            "registers": int(regs.group(1)),
            "stack": int(frame.group(1)),
            "spill_stores": int(frame.group(2)),
            "spill_loads": int(frame.group(3)),
        }
    return out


def functions(sass: str) -> dict[str, str]:
    """cuobjdump -sass text per function (mangled name -> its listing)."""
    out = {}
    for block in re.split(r"\n\s*Function : ", sass)[1:]:
        name, _, body = block.partition("\n")
        out[name.strip()] = body
    return out


def sm100_bwd_kernels(sass: str) -> dict[tuple[int, int, str], str]:
    """SASS of each 1-CTA SM100 backward main kernel (bwd_kernel<BwdTraits<d, d_v, element>>),
    keyed by (d, d_v, element) from the mangled name, element "bfloat16" or "half"."""
    out = {}
    for name, body in functions(sass).items():
        m = re.match(r"\S*bwd_kernelINS1_9BwdTraitsILi(\d+)ELi(\d+)EN7cutlass\d+(\w+?)_tE", name)
        if m:
            out[(int(m.group(1)), int(m.group(2)), m.group(3))] = body
    return out

"""Populate third_party/cutlass/include from the installed nvidia-cutlass wheel.

The wheel (pinned in pyproject.toml) ships the CUTLASS/CuTe headers under
cutlass_library.source_path/include. This links them (or copies them, with --copy) to
third_party/cutlass/include, where CMake and setup.py look, and records the version in
third_party/cutlass/.version. Running it again is harmless: an up-to-date result is left alone.

    python third_party/cutlass/fetch_headers.py [--copy]
"""

import argparse
import importlib.metadata
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEST = HERE / "include"
VERSION_FILE = HERE / ".version"
PYPROJECT = HERE.parent.parent / "pyproject.toml"


def wheel_include() -> tuple[Path, str]:
    try:
        import cutlass_library
    except ImportError:
        sys.exit(
            f"nvidia-cutlass is not installed for {sys.executable}: "
            f"pip install nvidia-cutlass=={pinned_version() or '<pinned version>'}"
        )
    src = Path(cutlass_library.source_path) / "include"
    if not (src / "cute" / "tensor.hpp").is_file():
        sys.exit(f"{src} has no cute/tensor.hpp: the nvidia-cutlass install looks incomplete")
    return src, importlib.metadata.version("nvidia-cutlass")


def pinned_version() -> str | None:
    if not PYPROJECT.is_file():
        return None
    match = re.search(r"nvidia-cutlass==([0-9][0-9.]*)", PYPROJECT.read_text())
    return match.group(1) if match else None


def remove_previous() -> None:
    """Drops an earlier result of this script; refuses to touch anything else."""
    if DEST.is_symlink():
        DEST.unlink()
    elif DEST.is_dir():
        if not VERSION_FILE.is_file():
            sys.exit(
                f"{DEST} exists but was not made by this script (no {VERSION_FILE.name}); "
                "remove it yourself if it can go"
            )
        shutil.rmtree(DEST)
    elif DEST.exists():
        sys.exit(f"{DEST} exists and is not a directory; remove it yourself if it can go")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--copy",
        action="store_true",
        help="copy the headers (27 MB) instead of symlinking them, e.g. to survive a venv rebuild",
    )
    args = parser.parse_args()

    src, version = wheel_include()
    pinned = pinned_version()
    if pinned and pinned != version:
        print(f"warning: nvidia-cutlass {version} installed, pyproject.toml pins {pinned}")

    mode = "copy" if args.copy else "symlink"
    record = f"nvidia-cutlass=={version}\nsource={src}\nmode={mode}\n"
    up_to_date = VERSION_FILE.is_file() and VERSION_FILE.read_text() == record
    if args.copy:
        up_to_date = up_to_date and DEST.is_dir() and not DEST.is_symlink()
    else:
        up_to_date = up_to_date and DEST.is_symlink() and DEST.resolve() == src.resolve()
    if up_to_date:
        print(f"{DEST} already holds nvidia-cutlass {version} ({mode} of {src}); nothing to do")
        return

    remove_previous()
    if args.copy:
        shutil.copytree(src, DEST, symlinks=True)
    else:
        DEST.symlink_to(src, target_is_directory=True)
    VERSION_FILE.write_text(record)
    print(f"{DEST}: {mode} of {src} (nvidia-cutlass {version}); recorded in {VERSION_FILE}")


if __name__ == "__main__":
    main()

"""Component ``megatron``: Megatron-Core 0.19.2's real GTP weight, for ``--weights megatron``.

The harness needs one file of Megatron-Core -
``megatron/core/tensor_parallel/generalized_tensor_parallelism.py`` and the few pure-Python
modules it imports - and TransformerEngine, which that file imports (component ``te``,
installed first when no TE is installed; an installed one, e.g. on a GPU machine, is kept).

On Python >= 3.12 this is ``pip install --no-deps megatron-core==0.19.2``. The 0.19.2 wheel is
tagged ``cp312`` and declares ``Requires-Python >=3.12`` only because of one compiled helper
(``megatron/core/datasets/helpers_cpp*.so``, used by dataset building, never by GTP); its
Python sources run on 3.11. On an older Python the wheel is downloaded for 3.12 and
*repackaged* as a pure wheel - the helper dropped, the tag ``py3-none-any``,
``Requires-Python`` relaxed, ``RECORD`` rewritten, and the repackaging stated in
``WHEEL`` - then pip-installed with ``--no-deps``, so ``pip show`` / ``pip uninstall`` work
as for any package. No Megatron dependency is installed: GTP needs only torch, numpy and
packaging, which the harness already has.

``missing()`` never imports torch or Megatron: it reads package metadata and file paths
(:func:`harness.vocabulary.weights.megatron_missing`, which the CLI and pytest use to refuse a
selection up front).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import sys
import tempfile
import zipfile
from pathlib import Path

from harness.install.pip import pip
from harness.vocabulary import weights

NAME = "megatron"
SUMMARY = "Megatron-Core 0.19.2's GTPShardedParam (weight 'megatron'; needs te)"

VERSION = weights.MEGATRON_VERSION
REQUIREMENT = f"megatron-core=={VERSION}"
#: the platform tags the cp312 wheel is published for (its Python sources are the same)
WHEEL_PLATFORM = "manylinux_2_28_x86_64"


def missing() -> str | None:
    """None when the harness can load Megatron's GTP module here, else what is missing."""
    return weights.megatron_missing()


def _record_row(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def repack_pure(wheel: Path, out_dir: Path) -> Path:
    """Rewrite the cp312 wheel as ``py3-none-any`` without its compiled files.

    Returns:
        The path of the new wheel in ``out_dir``.
    """
    out = out_dir / f"megatron_core-{VERSION}-py3-none-any.whl"
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as src:
        for info in src.infolist():
            if info.is_dir() or info.filename.endswith((".so", ".pyd")):
                continue
            files[info.filename] = src.read(info)
    dist_info = next(n.split("/")[0] for n in files if n.endswith(".dist-info/WHEEL"))
    wheel_meta = files[f"{dist_info}/WHEEL"].decode().splitlines()
    wheel_meta = [ln for ln in wheel_meta
                  if ln.strip() and not ln.startswith(("Tag:", "Root-Is-Purelib:"))]
    wheel_meta += ["Root-Is-Purelib: true", "Tag: py3-none-any",
                   f"Generator-Note: repackaged by dw-harness (python -m harness install megatron) "
                   f"from the cp312 wheel for Python {sys.version_info.major}.{sys.version_info.minor}: "
                   f"compiled datasets helper removed"]
    files[f"{dist_info}/WHEEL"] = ("\n".join(wheel_meta) + "\n").encode()
    meta = files[f"{dist_info}/METADATA"].decode().splitlines()
    files[f"{dist_info}/METADATA"] = ("\n".join(
        "Requires-Python: >=3.10" if ln.startswith("Requires-Python:") else ln for ln in meta)
        + "\n").encode()
    record_name = f"{dist_info}/RECORD"
    rows = [_record_row(n, d) for n, d in files.items() if n != record_name]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows + [[record_name, "", ""]])
    files[record_name] = buf.getvalue().encode()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for name, data in files.items():
            dst.writestr(name, data)
    return out


def install() -> None:
    """Install TE (component ``te``) when no TE is installed at all - an existing one, e.g.
    a GPU build, is left alone - then Megatron-Core 0.19.2 (repackaged below Python 3.12)."""
    from harness.install import InstallError, component

    if not weights.te_installed():
        component("te").install()
    if sys.version_info >= (3, 12):
        pip("install", "--no-deps", REQUIREMENT)
        return
    with tempfile.TemporaryDirectory(prefix="dw-megatron-") as tmp:
        tmpdir = Path(tmp)
        pip("download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
             "--implementation", "cp", "--abi", "cp312", "--platform", WHEEL_PLATFORM,
             "--dest", str(tmpdir), REQUIREMENT)
        wheels = list(tmpdir.glob("megatron_core-*.whl"))
        if len(wheels) != 1:
            raise InstallError(f"pip download of {REQUIREMENT} gave {len(wheels)} wheels")
        (tmpdir / "pure").mkdir()
        pure = repack_pure(wheels[0], tmpdir / "pure")
        pip("install", "--no-deps", "--force-reinstall", str(pure))

"""``benchmarks/gpu_bundle.py``: what travels to a GPU machine without network or Java. Building
a whole bundle downloads wheels and runs Maven and jlink (a minute and a half here), so the suite
checks its parts: every carried package is pinned, and a jar is re-stored with only this
platform's native libraries; ``gpu.sh`` refuses a folder that is no bundle before doing anything."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

from benchmarks.gpu_bundle import CARRIED, pinned, restore

ROOT = Path(__file__).resolve().parents[1]


def test_every_carried_package_is_pinned_by_the_lock() -> None:
    pins = pinned(CARRIED)
    assert [p.split("==")[0] for p in pins] == list(CARRIED)
    assert all(p.split("==")[1] for p in pins)


def test_a_jar_is_stored_uncompressed_with_only_the_host_natives(tmp_path: Path) -> None:
    entries = {
        "META-INF/MANIFEST.MF": b"Manifest-Version: 1.0\n",
        "com/github/luben/zstd/Zstd.class": bytes(range(256)) * 40,
        "linux/amd64/libzstd-jni-1.5.6-4.so": b"\x7fELF amd64",
        "linux/aarch64/libzstd-jni-1.5.6-4.so": b"\x7fELF arm",
        "darwin/x86_64/libzstd-jni-1.5.6-4.dylib": b"macho",
        "win/amd64/libzstd-jni-1.5.6-4.dll": b"MZ",
        "org/xerial/snappy/native/Linux/x86_64/libsnappyjava.so": b"\x7fELF snappy",
        "org/xerial/snappy/native/Linux/s390x/libsnappyjava.so": b"\x7fELF s390x",
    }
    src, dst = tmp_path / "in.jar", tmp_path / "out.jar"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    restore(src, dst)
    with zipfile.ZipFile(dst) as z:
        kept = {i.filename: z.read(i) for i in z.infolist()}
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
        assert z.testzip() is None
    assert kept == {k: v for k, v in entries.items()
                    if k.endswith((".MF", ".class")) or "/amd64/" in k and k.startswith("linux/")
                    or "Linux/x86_64" in k}


def test_gpu_sh_refuses_a_folder_that_is_no_bundle(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu.sh"), "--bundle", str(tmp_path),
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "is no bundle" in done.stderr and "benchmarks.gpu_bundle" in done.stderr
    assert not (tmp_path / "out").exists()

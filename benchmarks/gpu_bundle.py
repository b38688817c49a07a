"""An offline bundle for a GPU machine that has Python, torch and transformers but no network
and no Java: what `benchmarks/gpu.sh --bundle DIR` needs beside the repository.

    python -m benchmarks.gpu_bundle [--out .gpu-bundle] [--python-version 3.12]

Built here, where the registries answer; copied to the GPU machine with the repository.
Layout of DIR (about 50 MiB, so it travels with a checkout):

* ``wheels/*.whl``: the project's runtime dependencies that a CUDA image (torch, transformers,
  peft, numpy, aiohttp, rich, typer, ...) lacks, at the versions of ``infra/requirements.lock``,
  for CPython ``--python-version`` on manylinux x86-64. ``gpu.sh`` installs them with
  ``pip --no-index --target`` into a private folder: the image's own packages are left alone.
* ``java.tar.xz``: ``jre/``, a Java runtime cut with ``jlink`` to the modules the broker uses,
  and ``kafka/<version>/libs/``, the broker's own classpath (``kafka_2.13`` and its runtime
  dependencies, without the admin tools' web stack), jars stored uncompressed and with the
  native libraries of other platforms left out, so that xz packs them (23 MiB instead of 44).

The machine that builds the bundle needs a JDK (``jlink``; Debian: openjdk-17-jdk-headless)
and Maven; the broker it packs is the one ``joynexus broker`` runs here, same version.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "infra" / "requirements.lock"

# The runtime closure of gpu.sh's steps (group batching, tenant memory, the processes deployment
# of the service, the projection, the summary) minus what the GPU image already holds (its package
# list: /work/.library/device/KINDS.md of this workplace; a user's image may differ: add names).
# typing-extensions travels too: pydantic needs a newer one than some images carry.
CARRIED = (
    "aiokafka", "async-timeout", "cramjam", "fastavro", "structlog",
    "pydantic", "pydantic-core", "pydantic-settings", "python-dotenv", "annotated-types",
    "typing-inspection", "typing-extensions",
    "faust-streaming", "mode-streaming", "colorlog", "croniter", "pytz", "intervaltree",
    "terminaltables", "venusian", "aiohttp-cors",
    "gymnasium", "farama-notifications",
)
# What the broker touches of the JDK: JMX and its metrics, JAAS/SASL/GSS, JNDI, XML, the
# java.beans that reload4j configures itself with (java.desktop), sun.misc.Unsafe.
JAVA_MODULES = (
    "java.base,java.desktop,java.instrument,java.logging,java.management,java.management.rmi,"
    "java.naming,java.net.http,java.rmi,java.scripting,java.security.jgss,java.security.sasl,"
    "java.sql,java.transaction.xa,java.xml,jdk.crypto.ec,jdk.management,jdk.naming.dns,"
    "jdk.security.auth,jdk.security.jgss,jdk.unsupported,jdk.zipfs")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
# Native libraries inside the compression jars (zstd-jni, snappy-java, lz4-java) sit in a folder
# named after their OS and architecture; only x86-64 Linux's are kept.
NATIVE = re.compile(r"\.(so|dll|dylib|jnilib|a)$")
HOST_NATIVE = re.compile(r"(^|/)(linux|Linux)/(amd64|x86_64)/")


def pinned(names: tuple[str, ...]) -> list[str]:
    """``name==version`` for each name, as infra/requirements.lock pins it."""
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", LOCK.read_text(), re.M))
    pins = {k.lower().replace("_", "-"): v for k, v in pins.items()}
    missing = [n for n in names if n not in pins]
    if missing:
        raise SystemExit(f"not pinned in {LOCK}: {missing}")
    return [f"{n}=={pins[n]}" for n in names]


def download_wheels(dest: Path, python_version: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_version, "--implementation", "cp", *platforms,
                    "-d", str(dest), *pinned(CARRIED)], check=True)


def broker_jars(dest: Path, version: str) -> None:
    """The broker's runtime classpath, resolved by Maven from the project's pom without the tools."""
    pom = (ROOT / "infra" / "kafka" / "pom.xml").read_text()
    pom = re.sub(r"\s*<dependency>\s*<groupId>org.apache.kafka</groupId>\s*"
                 r"<artifactId>kafka-tools</artifactId>.*?</dependency>", "", pom, flags=re.S)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pom.xml").write_text(pom)
        subprocess.run(["mvn", "-q", "-B", "-f", str(Path(tmp) / "pom.xml"), "dependency:copy-dependencies",
                        f"-Dkafka.version={version}", f"-DoutputDirectory={tmp}/libs"], check=True)
        dest.mkdir(parents=True, exist_ok=True)
        for jar in sorted(Path(tmp, "libs").glob("*.jar")):
            restore(jar, dest / jar.name)
    (dest / ".complete").write_text(version)  # what LocalBroker.fetch looks for


def restore(src: Path, dst: Path) -> None:
    """Copy a jar with its entries stored, not deflated, and other platforms' natives left out."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            if NATIVE.search(item.filename) and not HOST_NATIVE.search(item.filename):
                continue
            data = zin.read(item)
            item.compress_type = zipfile.ZIP_STORED
            zout.writestr(item, data)


def java_runtime(dest: Path) -> None:
    java = shutil.which("java")
    beside_java = Path(java).resolve().parent / "jlink" if java else None
    jlink = shutil.which("jlink") or (str(beside_java) if beside_java and beside_java.exists() else None)
    if jlink is None:
        raise SystemExit("jlink not found: the bundle needs a JDK (Debian: openjdk-17-jdk-headless)")
    subprocess.run([jlink, "--add-modules", JAVA_MODULES, "--strip-debug", "--no-header-files",
                    "--no-man-pages", "--output", str(dest)], check=True)


def build(out: Path, python_version: str, kafka_version: str) -> None:
    shutil.rmtree(out, ignore_errors=True)
    download_wheels(out / "wheels", python_version)
    with tempfile.TemporaryDirectory() as tmp:
        java_runtime(Path(tmp) / "jre")
        broker_jars(Path(tmp) / "kafka" / kafka_version / "libs", kafka_version)
        with tarfile.open(out / "java.tar.xz", "w:xz", preset=6) as tar:
            tar.add(Path(tmp) / "jre", "jre")
            tar.add(Path(tmp) / "kafka", "kafka")
    sizes = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"bundle: {out} ({sizes / 2**20:.1f} MiB: {len(list((out / 'wheels').glob('*.whl')))} wheels, "
          f"java.tar.xz {(out / 'java.tar.xz').stat().st_size / 2**20:.1f} MiB)")


def main() -> None:
    from infra.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu-bundle")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's CPython, major.minor")
    args = parser.parse_args()
    build(args.out, args.python_version, Settings().kafka_version)


if __name__ == "__main__":
    main()

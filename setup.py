"""The compiled core (zen.native._core) as an optional extension: pip builds it where a C compiler
is found and installs zen without it, pure Python, where none is (`optional=True`)."""

from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).parent
SOURCES = sorted(str(p.relative_to(HERE)) for p in (HERE / "src" / "zen" / "native").glob("*.c"))
HEADERS = sorted(str(p.relative_to(HERE)) for p in (HERE / "src" / "zen" / "native").glob("*.h"))

setup(ext_modules=[Extension("zen.native._core", SOURCES, depends=HEADERS, optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"])])  # fmt: skip

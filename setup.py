"""The compiled core (zen.native._core) as an optional extension: pip builds it where a C compiler
is found and installs zen without it, pure Python, where none is (`optional=True`)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("zen.native._core", ["src/zen/native/_core.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"])])  # fmt: skip

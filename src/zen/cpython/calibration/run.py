"""Measure CPython's struct layouts in the running interpreter and write a layout profile (JSON).

Why measure instead of transcribing headers: offsets change between minor versions (and build
options), and a profile that was *measured* in an interpreter of the target's version is evidence
an investigator can reproduce: `zen profile python --python /path/to/python3.X`. Every offset here
is found by making objects whose contents we know, reading their bytes with ctypes at `id(obj)`,
and locating known values (object addresses, lengths, hashes, counts). Where several candidates
remain, a second, different sample disambiguates. A pointer is only ever dereferenced after
checking it lies in a readable mapping of this process (/proc/self/maps), so a wrong guess
cannot crash the calibration.

This package must stay runnable on its own with only the standard library, under any CPython from
3.8 on, because it is executed by *other* interpreters than the one zen runs on:

    python3.X -I -c 'import sys; sys.path.insert(0, SRC); from zen.cpython.calibration.run import main; main()' -o FILE

(`zen profile python --python python3.X` does exactly that.)

Fields the running interpreter cannot reveal (a few flag bit values) come from the C headers of
that version and are *verified* against real objects; the profile's "provenance" says which is
which.
"""

from __future__ import annotations

import gc
import platform
import struct
import sys

from zen.cpython.calibration.base import FORMAT, CalibrationFailed, CalibratorBase
from zen.cpython.calibration.bytecode import BytecodeMixin
from zen.cpython.calibration.legacy import LegacyMixin
from zen.cpython.calibration.monitoring import MonitoringMixin
from zen.cpython.calibration.objects import ObjectsMixin
from zen.cpython.calibration.state import StateMixin
from zen.cpython.calibration.values import ValuesMixin


class Calibrator(ValuesMixin, ObjectsMixin, StateMixin, MonitoringMixin, BytecodeMixin, CalibratorBase):
    def run(self) -> dict:
        gc.disable()
        try:
            self.object_header()
            self.unicode()
            self.numbers()
            self.sequences()
            self.dicts()
            self.instances()
            self.types()
            self.functions()
            self.code()
            self.monitoring()
            self.sets()
            extra = self.interpreter()
        finally:
            gc.enable()
        vi = sys.version_info
        return {
            "format": FORMAT,
            "kind": "cpython-layout",
            "python": {
                "version": platform.python_version(),
                "minor": f"{vi.major}.{vi.minor}",
                "hexversion": sys.hexversion,
                "implementation": sys.implementation.name,
                "abiflags": getattr(sys, "abiflags", ""),
                "debug_build": hasattr(sys, "gettotalrefcount"),
                "free_threaded": bool(getattr(sys, "_is_gil_enabled", lambda: True)() is False),
                "pointer_size": struct.calcsize("P"),
                "byteorder": sys.byteorder,
                "machine": platform.machine(),
                "system": platform.system(),
            },
            "structs": {k: self.structs[k] for k in sorted(self.structs)},
            "constants": dict(sorted(self.constants.items())),
            "set_dummy_type_name": self.dummy_type_name,
            "opcodes": self.opcodes(),
            "provenance": dict(sorted(self.provenance.items())),
            "self_checks": len(self.checks),
            "gc_generations_found": len(extra["gens"]),
        }


class LegacyCalibrator(LegacyMixin, Calibrator):
    """CPython 3.8-3.10: dicts, instances, code objects and frames of the pre-3.11 layouts."""


def calibrate() -> dict:
    if sys.implementation.name != "cpython":
        raise CalibrationFailed(f"only CPython can be calibrated, not {sys.implementation.name}")
    if sys.version_info < (3, 8):  # noqa: UP036 - run by other interpreters than zen's own
        raise CalibrationFailed(
            f"CPython {sys.version_info[0]}.{sys.version_info[1]} predates the layouts zen reads (3.8 and later: "
            "positional-only arguments in code objects, the GC header zen walks)"
        )
    if struct.calcsize("P") != 8 or sys.byteorder != "little":
        raise CalibrationFailed("only 64-bit little-endian interpreters are supported")
    if not sys.platform.startswith("linux"):
        raise CalibrationFailed("calibration reads /proc/self/maps and needs Linux")
    return (Calibrator if sys.version_info >= (3, 11) else LegacyCalibrator)().run()


def main(argv: list[str] | None = None) -> int:
    from zen.cpython.calibration.entry import run_main

    return run_main(argv, "Measure this interpreter's CPython struct layouts for zen.", calibrate, CalibrationFailed)


if __name__ == "__main__":
    sys.exit(main())

"""The torch side of printing a traced graph (`reuse.trace_code` starts it in a child process).

Reads `{class: IR text}` as JSON on stdin, has torch parse each graph (`torch._C.parse_ir`) and print it as a
TorchScript function (`GraphFunction.code`, torch's own printer, which knows every op's schema: which arguments are
keyword-only, which overload an op is), and prints one `ZEN-RESULT {json}` line: per class the code, its argument
names and annotations and its return annotation, or the error torch gave. Nothing from the image is executed: the
graphs are only parsed and printed, never run.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    try:
        import torch
    except ImportError as exc:
        print("ZEN-RESULT " + json.dumps({"error": f"torch is not importable by {sys.executable}: {exc}"}))
        return 0
    plans = json.load(sys.stdin)
    out: dict[str, dict] = {}
    for cls, ir in plans.items():
        try:
            fn = torch._C._create_function_from_graph("zen_forward", torch._C.parse_ir(ir))
            out[cls] = {"code": fn.code, "arguments": [[a.name, a.type.annotation_str] for a in fn.schema.arguments],
                        "returns": [r.type.annotation_str for r in fn.schema.returns]}  # fmt: skip
        except RuntimeError as exc:
            out[cls] = {"error": str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__}
    print("ZEN-RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The flight recorder's cost per streamed token in the daemon's process, without HTTP: the
reply capture on the request's path (``ReplyCapture.feed``, on the event loop) and the reply's
assembly in the writer thread (``row_of``, which holds the GIL the event loop needs).

    .venv/bin/python tests/perf/assemble_bench.py [--tokens 64] [--requests 1000] [--repeat 5]

Prints the best and median µs per token of each over the repeats (OpenAI chat chunks as vLLM
streams them). The figures move with the machine's load: note `uptime` beside them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines.gateway.exchange import ReplyCapture  # noqa: E402
from engines.recorder.assemble import row_of  # noqa: E402
from tests.engines.recorder.test_recorder_parts import exchange  # noqa: E402

BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'


def chunk(i: int) -> bytes:
    data = {
        "id": "chatcmpl-0123456789abcdef",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "delta": {"content": f"w{i} "}, "logprobs": None, "finish_reason": None}
        ],
    }
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    events = [chunk(i) for i in range(args.tokens)]
    per_token = 1e6 / (args.requests * args.tokens)
    tap_us: list[float] = []
    row_us: list[float] = []
    for _ in range(args.repeat):
        exchanges = []
        started = time.perf_counter()
        for _ in range(args.requests):
            ex = exchange(0, BODY)
            capture = ReplyCapture(ex, None)
            for event in events:
                capture.feed(event)
            ex.answered(200, None)
            exchanges.append(ex)
        tap_us.append((time.perf_counter() - started) * per_token)
        started = time.perf_counter()
        for ex in exchanges:
            row_of(ex)
        row_us.append((time.perf_counter() - started) * per_token)
    for name, values in (("capture (event loop)", tap_us), ("assembly (writer)", row_us)):
        print(
            f"{name:22} best {min(values):6.2f} µs/token  "
            f"median {statistics.median(values):6.2f} µs/token"
        )


if __name__ == "__main__":
    main()

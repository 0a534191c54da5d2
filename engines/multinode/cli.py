"""`traylm spread check PROFILE`: the preflight of one model across paired boxes."""

from __future__ import annotations

import argparse
import json
from typing import Any

from engines.client import DaemonClient


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("spread", help="one model across paired boxes (vLLM multi-node)")
    spread = s.add_subparsers(dest="spread_command", required=True)
    c = spread.add_parser(
        "check",
        help="check every box of a profile with `boxes`: engine version, model bytes, "
        "interface, rendezvous port, link speed, clocks",
    )
    c.add_argument("profile", help="a profile whose `boxes` lists paired boxes")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(func=cmd_check)


async def cmd_check(args: argparse.Namespace) -> int:
    async with await DaemonClient.connect(plain_calls=True) as client:
        report = await client.spread_check(args.profile)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0 if report["ok"] else 1
    print(f"warning: {report['warning']}")
    interface = report.get("interface")
    if interface:
        print(f"interface: {interface['interface']} ({interface['address']})")
    for line in report["links"]:
        print(line)
    for finding in report["findings"]:
        mark = "FAIL" if finding["blocking"] else "warn"
        print(f"{mark} [{finding['box']}, {finding['check']}] {finding['text']}")
    print("ready to start" if report["ok"] else "not ready: fix the FAIL lines above")
    return 0 if report["ok"] else 1

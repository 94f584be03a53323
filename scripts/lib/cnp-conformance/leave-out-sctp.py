#!/usr/bin/env python3
"""Leave SCTP out of sig-network's ClusterNetworkPolicy conformance suite.

Usage: leave-out-sctp.py DIR, where DIR is a writable copy of
sigs.k8s.io/network-policy-api v0.3.0. This kernel has no SCTP (and loads no
modules), so two things are changed, and nothing else (docs/conformance.md):

1. conformance/base/manifests.yaml: every container that serves SCTP (agnhost
   porter with a SERVE_SCTP_PORT_* variable: two per StatefulSet) is removed. On
   this kernel porter cannot open an SCTP socket, the container exits, and the
   suite's setup would wait for pods that never get Ready.
2. conformance/utils/kubernetes/helper.go: PokeServer returns at once, logging
   that it left the probe out, when the protocol is sctp. Every TCP and UDP
   probe of the same subtests still runs.

The four SCTP-only tests (CNP*SCTP) are skipped by the runner (go test -skip),
not here. Each change must apply exactly where expected, or this fails.
"""
import re
import sys
from pathlib import Path


def drop_sctp_containers(text: str) -> tuple[str, int]:
    """Remove each `        - name:` container item holding SERVE_SCTP_PORT_."""
    lines = text.split("\n")
    out, item, dropped = [], None, 0

    def flush():
        nonlocal item, dropped
        if item is not None:
            if any("SERVE_SCTP_PORT_" in line for line in item):
                dropped += 1
            else:
                out.extend(item)
        item = None

    for line in lines:
        if line.startswith("        - name: "):
            flush()
            item = [line]
        elif item is not None and (line.startswith("         ") or line.startswith("          ")):
            item.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out), dropped


POKE = re.compile(
    r"(func PokeServer\(t \*testing\.T, [^\n]*shouldConnect bool\) \{\n)"
)
SKIP_SCTP = (
    '\tif protocol == "sctp" {\n'
    '\t\tt.Logf("podnet: SCTP probe left out (this kernel has no SCTP): %s/%s -> %s:%d",\n'
    "\t\t\tclientNamespace, clientPod, targetHost, targetPort)\n"
    "\t\treturn\n"
    "\t}\n"
)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: leave-out-sctp.py DIR", file=sys.stderr)
        return 2
    root = Path(sys.argv[1]) / "conformance"
    manifests = root / "base" / "manifests.yaml"
    text, dropped = drop_sctp_containers(manifests.read_text())
    if dropped != 10 or "SCTP" in text:
        print(f"leave-out-sctp: expected 10 SCTP containers in {manifests}, removed {dropped}", file=sys.stderr)
        return 1
    manifests.write_text(text)
    helper = root / "utils" / "kubernetes" / "helper.go"
    source, n = POKE.subn(lambda m: m.group(1) + SKIP_SCTP, helper.read_text())
    if n != 1:
        print(f"leave-out-sctp: PokeServer not found once in {helper} ({n})", file=sys.stderr)
        return 1
    helper.write_text(source)
    print(f"leave-out-sctp: removed {dropped} SCTP containers, PokeServer skips sctp probes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

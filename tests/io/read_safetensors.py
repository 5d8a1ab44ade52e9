#!/usr/bin/env python3
"""Independent safetensors reader (standard library only) for the tests.

usage: read_safetensors.py FILE DIR
Checks that every tensor in FILE has exactly the bytes of DIR/<name>.bin,
that the header is valid JSON padded to 8 bytes, and that offsets tile the
data block. Prints one line per tensor; exits 1 on any mismatch.
"""
import json
import struct
import sys

SIZES = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I8": 1, "U8": 1,
         "I32": 4, "I64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def main():
    path, ref_dir = sys.argv[1], sys.argv[2]
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    data = blob[8 + hlen:]
    ok = hlen % 8 == 0
    spans = []
    for name, e in sorted(header.items()):
        if name == "__metadata__":
            print("metadata", json.dumps(e, sort_keys=True))
            continue
        b, end = e["data_offsets"]
        n = 1
        for s in e["shape"]:
            n *= s
        ok &= end - b == n * SIZES[e["dtype"]]
        spans.append((b, end))
        with open(f"{ref_dir}/{name}.bin", "rb") as r:
            same = r.read() == data[b:end]
        ok &= same
        print(name, e["dtype"], e["shape"], "bytes-equal" if same else "DIFFERENT")
    spans.sort()
    pos = 0
    for b, end in spans:
        ok &= b == pos
        pos = end
    ok &= pos == len(data)
    print("ok" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

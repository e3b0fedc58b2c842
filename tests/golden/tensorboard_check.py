#!/usr/bin/env python3
"""Check that TensorBoard itself reads cohort's event files (tests/test_events).

  tensorboard_check.py LOGDIR EXPECTED.json

EXPECTED.json: {"events_total": N, "scalars": {"tag": [[step, value], ...], ...}}.
Reads every event file of LOGDIR with tensorboard's EventFileLoader (which
checks the TFRecord CRC32Cs and stops at a bad record: the total count of
events shows it) and checks the first event of each is file_version
"brain.Event:2"; then
loads LOGDIR with EventAccumulator (what `tensorboard --logdir` uses) and
checks the scalar tags, steps and values (as float32).

Needs the `tensorboard` package (PyPI; Debian 12 has none): exit status 77
(skip) when it cannot be imported, 0 when everything matches, 1 otherwise.
"""
import glob
import json
import os
import struct
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
except ImportError as e:
    print(f"tensorboard is not importable by {sys.executable}: {e}")
    sys.exit(77)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_ulps(a, b):
    """How many float32 steps apart two float32 values are (their bit
    patterns as ordered integers)."""
    def key(v):
        i = struct.unpack("<i", struct.pack("<f", v))[0]
        return i if i >= 0 else -(i & 0x7FFFFFFF)
    return abs(key(a) - key(b))


def main(logdir, expected_path):
    with open(expected_path) as f:
        expected = json.load(f)
    errors = []
    files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
    if not files:
        errors.append(f"no event files in {logdir}")
    total = 0
    for path in files:
        events = list(EventFileLoader(path).Load())
        total += len(events)
        if not events or events[0].file_version != "brain.Event:2":
            errors.append(f"{path}: first event is not file_version brain.Event:2")
    if total != expected["events_total"]:
        errors.append(f"TensorBoard read {total} events from {len(files)} files, expected "
                      f"{expected['events_total']} (CRC or framing error?)")

    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for tag, points in expected["scalars"].items():
        if tag not in tags:
            errors.append(f"scalar tag {tag!r} missing (TensorBoard sees {sorted(tags)})")
            continue
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        want = [(int(s), f32(v)) for s, v in points]
        # the event file holds float32(value); the CSV holds the double value
        # to 9 digits, whose float32 may be one step away (double rounding:
        # images_per_sec 1773.20916... is float32 1773.2091064 directly,
        # 1773.2092285 through its 9-digit text)
        if len(got) != len(want) or any(gs != ws or f32_ulps(gv, wv) > 1
                                        for (gs, gv), (ws, wv) in zip(got, want)):
            errors.append(f"scalar {tag!r}: TensorBoard reads {got}, expected {want}")
    extra = set(tags) - set(expected["scalars"])
    if extra:
        errors.append(f"unexpected scalar tags {sorted(extra)}")
    if errors:
        for e in errors:
            print(e, file=sys.stderr)
        return 1
    print(f"TensorBoard reads {len(files)} event file(s) in {logdir}: tags {sorted(tags)} as expected")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))

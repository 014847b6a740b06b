#!/usr/bin/env python3
"""Writes the quickstart's two offline evaluations of the `synthetic_probes` data.

  configs/evals/probe-rows.jsonl         multiple_choice: which of four rows is a valid probe row
  configs/evals/probe-coordinates.jsonl  generate_match: a host's coordinates from its header

The host table is that of plugins/synthetic_probes/synthetic_probes.cpp, ported here: splitmix64
(core/include/ablate/mix.hpp), its SplitMix generator (next() = splitmix64(state), then state +=
0x9E3779B97F4A7C15; uniform() = (next() >> 11) * 2^-53), mix(a, b) = splitmix64(a ^ (b *
0xD6E8FEB86659FD93)) modulo 2^64, and the hosts drawn from SplitMix(mix(seed, 0x486F737473)) in
the constructor's order: latitude uniform on the sphere between 60S and 70N (the asin formula),
longitude uniform in [-180, 180), last-mile latency 0.5 + 4.5 u ms. A header writes the
coordinates rounded half away from zero (C's lround), an RTT its tenths the same way.

The items themselves are drawn by this file (not by the data source's generator), from Python's
Mersenne Twister seeded with --item-seed, through random() alone (every draw below is built from
it), so the files do not change with the standard library's other sampling functions.

probe-rows: a context is a session of a random source host as the data source writes one: the
header "#h<src> <lat> <lon>\\n" and 2-6 rows "h<dest> <seconds> <rtt>\\n" (dest != src; seconds
start below 60 and grow by 1-30; RTT = base_src + base_dst + 2 d / 200 km/ms (1.2 + 0.4 u)
- 2 ln(1 - u'), written with one decimal). The right ending is one more such row. The three
distractors are that row broken in three different ways, drawn from: fields swapped (seconds
before the host), the decimal point missing or moved ("635", "6.35"), the host token doubled,
seconds going backwards (below the previous row's: a row of valid form that cannot follow), an
RTT with no decimal digit ("63."), a row starting with '#'. Each is within one token of the right
ending's length. The right ending's position is balanced: each of the four positions is the
label of a quarter of the items, in a shuffled order.

probe-coordinates: for each host N, the prompt "#h<N>" and the answer " <lat> <lon>\\n", the rest
of the header every session of that host starts with.

Every text is checked to be in the probe-log alphabet (digits, ' ', '\\n', '.', '-', '#', h<N>
with N below --hosts) before anything is written. --check regenerates both files in memory and
exits 1 when the files on disk differ from them (or do not parse, or break the alphabet).

  tools/make_probe_evals.py            # writes both files under configs/evals/
  tools/make_probe_evals.py --check    # exit 0: the committed files are this script's output
"""
import argparse
import json
import math
import os
import random
import sys

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
EARTH_RADIUS_KM = 6371.0
FIBRE_KM_PER_MS = 200.0

ROWS_FILE = "probe-rows.jsonl"
COORDINATES_FILE = "probe-coordinates.jsonl"

KINDS = ("swapped", "decimal", "doubled_host", "backwards", "no_decimal_digit", "header_marker")


def splitmix64(z):
    """ablate::splitmix64 (core/include/ablate/mix.hpp), modulo 2^64."""
    z = (z + GOLDEN_GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def mix(a, b):
    """synthetic_probes.cpp's mix(a, b) = splitmix64(a ^ (b * 0xD6E8FEB86659FD93))."""
    return splitmix64((a ^ ((b * 0xD6E8FEB86659FD93) & MASK64)) & MASK64)


class SplitMix:
    """synthetic_probes.cpp's SplitMix generator."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        z = splitmix64(self.state)
        self.state = (self.state + GOLDEN_GAMMA) & MASK64
        return z

    def uniform(self):
        return float(self.next() >> 11) * (1.0 / 9007199254740992.0)


def lround(x):
    """C's lround: to the nearest integer, halves away from zero."""
    a = abs(x)
    whole = math.floor(a)
    n = int(whole) + (1 if a - whole >= 0.5 else 0)  # a - floor(a) is exact for a double
    return -n if x < 0 else n


def make_hosts(seed, count):
    """(lat_deg, lon_deg, base_ms) per host, as SyntheticProbes' constructor draws them."""
    g = SplitMix(mix(seed, 0x486F737473))
    lo = math.sin(-60.0 * math.pi / 180)
    hi = math.sin(70.0 * math.pi / 180)
    hosts = []
    for _ in range(count):
        lat = math.asin(lo + g.uniform() * (hi - lo))
        lat_deg = lat * 180 / math.pi  # the same operations in the same order as the C++
        lon_deg = -180.0 + 360.0 * g.uniform()
        base_ms = 0.5 + 4.5 * g.uniform()
        hosts.append((lat_deg, lon_deg, base_ms))
    return hosts


def distance_km(a, b):
    la1, la2 = a[0] * math.pi / 180, b[0] * math.pi / 180
    dla, dlo = la2 - la1, (b[1] - a[1]) * math.pi / 180
    h = math.sin(dla / 2) * math.sin(dla / 2) + math.cos(la1) * math.cos(la2) * math.sin(dlo / 2) * math.sin(dlo / 2)
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def header(host_index, host):
    return f"#h{host_index} {lround(host[0])} {lround(host[1])}\n"


class Draws:
    """Item draws from random.Random's random() alone."""

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def uniform(self):
        return self.rng.random()

    def below(self, n):
        return min(int(self.rng.random() * n), n - 1)

    def between(self, lo, hi):  # both ends included
        return lo + self.below(hi - lo + 1)

    def shuffle(self, values):  # Fisher-Yates
        for i in range(len(values) - 1, 0, -1):
            j = self.below(i + 1)
            values[i], values[j] = values[j], values[i]

    def pick(self, values, k):  # k distinct values, in drawn order
        pool = list(values)
        return [pool.pop(self.below(len(pool))) for _ in range(k)]


def tenths_of_rtt(draws, hosts, source, dest):
    src, dst = hosts[source], hosts[dest]
    rtt = src[2] + dst[2] + 2.0 * distance_km(src, dst) / FIBRE_KM_PER_MS * (1.2 + 0.4 * draws.uniform()) \
        - 2.0 * math.log(1.0 - draws.uniform())
    return lround(rtt * 10.0)


def draw_row(draws, hosts, source, seconds):
    dest = draws.below(len(hosts) - 1)
    if dest >= source:
        dest += 1  # never probe yourself
    return (dest, seconds, tenths_of_rtt(draws, hosts, source, dest))


def write_row(dest, seconds, rtt_text):
    return f"h{dest} {seconds} {rtt_text}\n"


def rtt_text(tenths):
    return f"{tenths // 10}.{tenths % 10}"


def broken_row(kind, draws, row, previous_seconds):
    dest, seconds, tenths = row
    if kind == "swapped":
        return f"{seconds} h{dest} {rtt_text(tenths)}\n"
    if kind == "decimal":
        digits = f"{tenths // 10}{tenths % 10}"
        if len(digits) < 3 or draws.below(2) == 0:
            return write_row(dest, seconds, digits)  # missing
        point = draws.between(1, len(digits) - 2)  # moved: anywhere but before the last digit
        return write_row(dest, seconds, digits[:point] + "." + digits[point:])
    if kind == "doubled_host":
        return f"h{dest}h{dest} {seconds} {rtt_text(tenths)}\n"
    if kind == "backwards":
        # Below the previous row's seconds, by as much as a step forward can be, so that the
        # number has about the right number of digits.
        earlier = previous_seconds - draws.between(1, min(30, previous_seconds))
        return write_row(dest, earlier, rtt_text(tenths))
    if kind == "no_decimal_digit":
        return write_row(dest, seconds, f"{tenths // 10}.")
    if kind == "header_marker":
        return "#" + write_row(dest, seconds, rtt_text(tenths))
    raise ValueError(kind)


def tokenize(text, hosts):
    """The data source's encode(): a list of tokens (str), or a ValueError naming the problem."""
    tokens = []
    i = 0
    while i < len(text):
        c = text[i]
        if c in "0123456789 \n.-#":
            tokens.append(c)
            i += 1
        elif c == "h" and i + 1 < len(text) and text[i + 1].isdigit():
            j = i + 1
            while j < len(text) and text[j] in "0123456789":
                j += 1
            if int(text[i + 1:j]) >= hosts:
                raise ValueError(f"host {text[i:j]} does not exist (hosts h0..h{hosts - 1})")
            tokens.append(text[i:j])
            i = j
        else:
            raise ValueError(f"character {c!r} at offset {i} is not in the probe-log alphabet")
    return tokens


def make_rows_items(hosts, count, draws):
    labels = [i % 4 for i in range(count)]
    draws.shuffle(labels)
    items = []
    for n in range(count):
        source = draws.below(len(hosts))
        context = header(source, hosts[source])
        seconds = draws.below(60)
        previous = None
        for _ in range(draws.between(2, 6)):
            previous = draw_row(draws, hosts, source, seconds)
            context += write_row(previous[0], previous[1], rtt_text(previous[2]))
            seconds += 1 + draws.below(30)
        row = draw_row(draws, hosts, source, seconds)
        right = write_row(row[0], row[1], rtt_text(row[2]))
        distractors = [broken_row(kind, draws, row, previous[1]) for kind in draws.pick(KINDS, 3)]
        draws.shuffle(distractors)
        endings = distractors[:labels[n]] + [right] + distractors[labels[n]:]
        items.append({"context": context, "endings": endings, "label": labels[n], "id": f"probe-rows-{n:03d}"})
    return items


def make_coordinates_items(hosts):
    items = []
    for n, host in enumerate(hosts):
        items.append({"prompt": f"#h{n}", "answer": header(n, host)[len(f"#h{n}"):], "id": f"probe-coordinates-{n:02d}"})
    return items


def validate(name, items, hosts):
    """Problems with the items (list of str): alphabet, hosts, the items' shape."""
    problems = []
    for line, item in enumerate(items, 1):
        where = f"{name}:{line}"
        if not isinstance(item, dict):
            problems.append(f"{where}: not a JSON object")
            continue
        endings = item.get("endings", [])
        if not isinstance(endings, list):
            problems.append(f"{where}: endings are not a list")
            continue
        tokens = {}
        for text in [item.get("context"), item.get("prompt"), item.get("answer")] + endings:
            if text is None:
                continue
            if not isinstance(text, str):
                problems.append(f"{where}: {text!r} is not a string")
                continue
            try:
                tokens[text] = tokenize(text, hosts)
            except ValueError as e:
                problems.append(f"{where}: {e}")
        if "endings" in item:
            label = item.get("label")
            if len(endings) != 4 or len(set(map(str, endings))) != 4:
                problems.append(f"{where}: expected 4 different endings")
            elif isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < 4:
                problems.append(f"{where}: label {label!r} is not in 0..3")
            elif all(e in tokens for e in endings):
                lengths = [len(tokens[e]) for e in endings]
                if any(abs(n - lengths[label]) > 1 for n in lengths):
                    problems.append(f"{where}: ending lengths {lengths} differ by more than one token")
    return problems


def to_jsonl(items):
    return "".join(json.dumps(item, ensure_ascii=True, separators=(", ", ": ")) + "\n" for item in items)


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=os.path.join(repo, "configs", "evals"),
                        help="where the two files go (default: configs/evals of this repository)")
    parser.add_argument("--seed", type=int, default=1234, help="the data source's data.seed (default 1234)")
    parser.add_argument("--hosts", type=int, default=64, help="the data source's data.hosts (default 64)")
    parser.add_argument("--items", type=int, default=200, help="probe-rows items (default 200, a multiple of 4)")
    parser.add_argument("--item-seed", type=int, default=20240611, help="seed of the items' draws")
    parser.add_argument("--check", action="store_true", help="compare with the files on disk; write nothing")
    args = parser.parse_args()
    if not 2 <= args.hosts <= 65000 or args.seed < 0 or args.items < 4 or args.items % 4:
        parser.error("--hosts must be in [2, 65000], --seed >= 0, --items a positive multiple of 4")

    hosts = make_hosts(args.seed, args.hosts)
    files = {
        ROWS_FILE: make_rows_items(hosts, args.items, Draws(args.item_seed)),
        COORDINATES_FILE: make_coordinates_items(hosts),
    }
    problems = []
    for name, items in files.items():
        problems += validate(name, items, args.hosts)
    if problems:
        print("make_probe_evals: generated items are invalid:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1

    if args.check:
        failed = False
        for name, items in files.items():
            path = os.path.join(args.out_dir, name)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError) as e:
                print(f"make_probe_evals: cannot read {path}: {e}", file=sys.stderr)
                failed = True
                continue
            try:
                on_disk = [json.loads(line) for line in text.splitlines()]
            except ValueError as e:
                print(f"make_probe_evals: {path} is not JSON Lines: {e}", file=sys.stderr)
                failed = True
                continue
            for problem in validate(path, on_disk, args.hosts):
                print(f"make_probe_evals: {problem}", file=sys.stderr)
                failed = True
            if text != to_jsonl(items):
                differing = next((i + 1 for i, (a, b) in enumerate(zip(on_disk, items)) if a != b),
                                 min(len(on_disk), len(items)) + 1)
                print(f"make_probe_evals: {path} differs from what this script generates (first at line "
                      f"{differing}); run tools/make_probe_evals.py to rewrite it", file=sys.stderr)
                failed = True
        if failed:
            return 1
        print(f"make_probe_evals: {', '.join(files)} are up to date")
        return 0

    os.makedirs(args.out_dir, exist_ok=True)
    for name, items in files.items():
        path = os.path.join(args.out_dir, name)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(to_jsonl(items))
        print(f"make_probe_evals: wrote {len(items)} items to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

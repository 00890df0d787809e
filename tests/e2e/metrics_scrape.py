"""metrics_scrape.py — the checks of test_metrics_endpoint.sh that want a
parser: the Prometheus text exposition format (version 0.0.4) read strictly
by hand (no client library), and the scraped values against metrics.jsonl.

  metrics_scrape.py parse FILE            prints the value of strata_step
  metrics_scrape.py match RUN_DIR FILE    the scrape equals the metrics.jsonl
                                          line of its step (and the latest eval)
  metrics_scrape.py loopback PORT         the port listens on 127.0.0.1 only

Exits 1 naming the first problem.
"""
import json
import math
import re
import sys

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def fail(msg):
    print(f"metrics_scrape: {msg}", file=sys.stderr)
    sys.exit(1)


def parse_value(text, where):
    if text in ("NaN", "+Inf", "-Inf"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    try:
        return float(text)
    except ValueError:
        fail(f"{where}: value {text!r} is not a number")


def parse_labels(s, i, where):
    """Parses {a="x",b="y"} from s[i] == '{'; returns (dict, index after '}')."""
    labels = {}
    i += 1
    while True:
        if s[i] == "}":
            return labels, i + 1
        m = LABEL.match(s, i)
        if not m:
            fail(f"{where}: bad label name at {s[i:]!r}")
        name = m.group(0)
        i = m.end()
        if s[i : i + 2] != '="':
            fail(f"{where}: label {name} without =\"")
        i += 2
        value = []
        while s[i] != '"':
            if s[i] == "\\":
                esc = s[i + 1]
                if esc not in 'n"\\':
                    fail(f"{where}: bad escape \\{esc}")
                value.append("\n" if esc == "n" else esc)
                i += 2
            else:
                if s[i] == "\n":
                    fail(f"{where}: raw newline in a label value")
                value.append(s[i])
                i += 1
        i += 1
        if name in labels:
            fail(f"{where}: label {name} twice")
        labels[name] = "".join(value)
        if s[i] == ",":
            i += 1
        elif s[i] != "}":
            fail(f"{where}: expected , or }} after label {name}")


def parse(text):
    """{family: {"help": str, "type": str, "samples": [(labels, value)]}}; checks
    that every sample follows its family's HELP and TYPE and that a family's
    samples are contiguous."""
    if not text.endswith("\n"):
        fail("the exposition does not end in a newline")
    families = {}
    current = None
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = f"line {n}"
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            kind, rest = line[2:6].lower(), line[7:]
            name, _, arg = rest.partition(" ")
            if not NAME.fullmatch(name):
                fail(f"{where}: bad metric name {name!r}")
            fam = families.setdefault(name, {"help": None, "type": None, "samples": []})
            if fam["samples"]:
                fail(f"{where}: {kind.upper()} of {name} after its samples")
            if fam[kind] is not None:
                fail(f"{where}: second {kind.upper()} of {name}")
            if kind == "type" and arg not in ("gauge", "counter", "untyped", "summary", "histogram"):
                fail(f"{where}: type {arg!r}")
            fam[kind] = arg
            current = name
            continue
        if line.startswith("#") or not line:
            continue
        m = NAME.match(line)
        if not m:
            fail(f"{where}: no metric name: {line!r}")
        name = m.group(0)
        i = m.end()
        labels = {}
        if line[i] == "{":
            labels, i = parse_labels(line, i, where)
        if line[i] != " ":
            fail(f"{where}: no space before the value")
        value = parse_value(line[i + 1 :].split(" ")[0], where)
        fam = families.get(name)
        if fam is None or fam["help"] is None or fam["type"] is None:
            fail(f"{where}: sample of {name} without HELP and TYPE before it")
        if name != current:
            fail(f"{where}: samples of {name} are not contiguous")
        fam["samples"].append((labels, value))
    return families


def scalar(fams, name):
    fam = fams.get(name)
    if not fam or len(fam["samples"]) != 1:
        fail(f"no single sample of {name}")
    return fam["samples"][0][1]


def metric_name(field):
    if field in ("peak_live_by_category", "peak_live_by_category_predicted"):
        return "strata_" + field + "_bytes"
    if field.endswith("_per_s"):
        return "strata_" + field[:-6] + "_per_second"
    if field.endswith("_s"):
        return "strata_" + field[:-2] + "_seconds"
    return "strata_" + field


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def match(run_dir, scrape_path):
    fams = parse(open(scrape_path).read())
    step = int(scalar(fams, "strata_step"))
    lines = [json.loads(x) for x in open(f"{run_dir}/metrics.jsonl")]
    steps = [x for x in lines if "loss" in x and x["step"] == step]
    if len(steps) != 1:
        fail(f"metrics.jsonl has {len(steps)} step lines of step {step}")
    line = steps[0]
    run = run_dir.rstrip("/").rsplit("/", 1)[-1]
    checked = 0
    for field, v in line.items():
        if isinstance(v, dict):
            fam = fams.get(metric_name(field))
            if fam is None:
                fail(f"no family for {field}")
            got = {tuple(sorted(lb.items())): val for lb, val in fam["samples"]}
            label = field.split("_by_", 1)[1].split("_")[0] if "_by_" in field else "key"
            for k, kv in v.items():
                key = tuple(sorted(((label, k), ("run", run))))
                if key not in got or not same(got[key], float(kv)):
                    fail(f"{field}[{k}]: scraped {got.get(key)}, metrics.jsonl {kv}")
                checked += 1
            continue
        want = math.nan if v is None else float(v)
        name = metric_name(field)
        fam = fams.get(name)
        if fam is None:
            fail(f"no {name} for metrics.jsonl's {field}")
        if fam["samples"][0][0] != {"run": run}:
            fail(f"{name}: labels {fam['samples'][0][0]}, want run={run!r}")
        if not same(scalar(fams, name), want):
            fail(f"{name} = {scalar(fams, name)}, metrics.jsonl step {step} {field} = {v}")
        checked += 1
    # A scrape between step N's line and its evaluation's sees the eval
    # before N: either of the two newest evaluations up to N.
    evals = [x for x in lines if "eval_loss" in x and x["step"] <= step]
    if evals:
        newest = evals[-1]
        allowed = [float(newest["eval_loss"])]
        if newest["step"] == step:
            allowed.append(float(evals[-2]["eval_loss"]) if len(evals) > 1 else None)
        got = scalar(fams, "strata_eval_loss") if "strata_eval_loss" in fams else None
        if not any((a is None and got is None) or (a is not None and got is not None and same(got, a)) for a in allowed):
            fail(f"strata_eval_loss = {got}, evaluations up to step {step}: {evals[-2:]}")
    if checked < 10:
        fail(f"only {checked} values compared")
    print(f"step {step}: {checked} values equal metrics.jsonl")


def loopback(port):
    """Every socket listening on |port| is bound to 127.0.0.1 (IPv4), none
    to another address or IPv6."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for row in f:
                cols = row.split()
                addr, hexport = cols[1].split(":")
                if int(hexport, 16) == port and cols[3] == "0A":  # LISTEN
                    found.append((table, addr))
    if found != [("/proc/net/tcp", "0100007F")]:
        fail(f"listening sockets on port {port}: {found}, want only 127.0.0.1 (0100007F) in /proc/net/tcp")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "parse":
        print(int(scalar(parse(open(sys.argv[2]).read()), "strata_step")))
    elif cmd == "match":
        match(sys.argv[2], sys.argv[3])
    elif cmd == "loopback":
        loopback(int(sys.argv[2]))
    else:
        fail(f"unknown command {cmd}")

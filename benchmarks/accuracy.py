"""Accuracy table: runs `ngnn train` for each configuration and prints a markdown table.

    python benchmarks/accuracy.py                          # every configuration below
    python benchmarks/accuracy.py --only gcn-cora gat-cora # some of them
    python benchmarks/accuracy.py --from-logs LOGDIR       # the table from earlier logs

Each configuration's full output is kept in LOGDIR/<name>.log, so long runs can be split
over several invocations (or machines) and tabulated once at the end.
"""
import argparse
import os
import re
import subprocess
import sys

# (name, ngnn train arguments): the papers' hyper-parameters are the CLI's defaults.
CONFIGS = [
    ("gcn-cora", ["--model", "gcn", "--dataset", "cora", "--runs", "5"]),
    ("gcn-citeseer", ["--model", "gcn", "--dataset", "citeseer", "--runs", "5"]),
    ("gat-cora", ["--model", "gat", "--dataset", "cora", "--runs", "5"]),
    ("gat-citeseer", ["--model", "gat", "--dataset", "citeseer", "--runs", "5"]),
    ("gcn-amazon_photo", ["--model", "gcn", "--dataset", "amazon_photo", "--runs", "1"]),
    ("gat-amazon_photo", ["--model", "gat", "--dataset", "amazon_photo", "--runs", "1"]),
    ("sage-amazon_photo", ["--model", "sage", "--dataset", "amazon_photo", "--runs", "1"]),
    ("gcn-amazon_computers", ["--model", "gcn", "--dataset", "amazon_computers",
                              "--runs", "1"]),
    ("sage-amazon_computers", ["--model", "sage", "--dataset", "amazon_computers",
                               "--runs", "1"]),
    ("gcn-coauthor_cs", ["--model", "gcn", "--dataset", "coauthor_cs", "--runs", "1"]),
    ("sage-coauthor_cs", ["--model", "sage", "--dataset", "coauthor_cs", "--runs", "1"]),
]

RESULT = re.compile(r"^test accuracy: ([\d.]+) ± ([\d.]+) \((\d+) runs\)$", re.M)
TIMING = re.compile(r"^time per epoch: ([\d.]+) ms", re.M)
EPOCHS = re.compile(r"^run \d+/\d+ .*, (\d+) epochs", re.M)


def run(name, arguments, log_dir, backend):
    command = [sys.executable, "-m", "ngnn.cli", "train", "--no-progress",
               "--backend", backend] + arguments
    print(f"{name}: {' '.join(['ngnn'] + command[3:])}", file=sys.stderr, flush=True)
    with open(os.path.join(log_dir, name + ".log"), "w") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=True)


def row(name, arguments, log_dir):
    with open(os.path.join(log_dir, name + ".log")) as log:
        text = log.read()
    result = RESULT.search(text)
    if not result:
        raise ValueError(f"{name}.log has no final accuracy line; did the run finish?")
    timing = TIMING.search(text)
    epochs = [int(e) for e in EPOCHS.findall(text)]
    model, dataset = arguments[1], arguments[3]
    return (f"| {model.upper()} | {dataset} | {result[1]} ± {result[2]} | {result[3]} | "
            f"{min(epochs)}-{max(epochs)} | {timing[1] if timing else '-'} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=[name for name, _ in CONFIGS])
    parser.add_argument("--log-dir", default="accuracy-logs")
    parser.add_argument("--from-logs", action="store_true",
                        help="tabulate the logs in --log-dir that exist, run nothing")
    parser.add_argument("--backend", default="numpy")
    args = parser.parse_args()
    configs = [(n, a) for n, a in CONFIGS if not args.only or n in args.only]
    os.makedirs(args.log_dir, exist_ok=True)
    if args.from_logs:
        configs = [(n, a) for n, a in configs
                   if os.path.exists(os.path.join(args.log_dir, n + ".log"))]
    else:
        for name, arguments in configs:
            run(name, arguments, args.log_dir, args.backend)
    print("| model | dataset | test accuracy (%) | runs | epochs | ms/epoch |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, arguments in configs:
        print(row(name, arguments, args.log_dir))


if __name__ == "__main__":
    main()

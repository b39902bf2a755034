#!/usr/bin/env python3
"""Plots what ./tp -o DIR wrote: DIR/log.csv -> DIR/loss.png, and DIR/sweep.csv (from --sweep 1) -> DIR/sweep.png.

    python3 data/plot.py DIR [--floor NATS]

--floor draws the loss floor (the embedded corpus prints it: "its entropy is ... nats per token").
Needs matplotlib (pip install matplotlib).
"""
import argparse
import csv
import os
import sys


def fail(msg):
    print(f"plot.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def read_csv(path, columns):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        fail(f"{path} has no rows")
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        fail(f"{path} lacks the columns {', '.join(missing)}: was it written by ./tp?")
    return rows


def plot_loss(plt, path, out, floor):
    rows = read_csv(path, ["step", "loss", "val_loss"])
    steps = [int(r["step"]) for r in rows]
    loss = [float(r["loss"]) for r in rows]
    val = [(int(r["step"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, loss, lw=0.8, alpha=0.6, label="train loss")
    if val:
        # val loss is measured before the step of its row: plot it at the steps already taken
        ax.plot([s - 1 for s, _ in val], [v for _, v in val], "o-", label="val loss")
    if floor:
        ax.axhline(floor, color="k", ls="--", lw=1, label=f"floor {floor:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def plot_sweep(plt, path, out):
    rows = read_csv(path, ["P", "tok_per_s", "comm_share", "mb_per_rank"])
    # a grid of P tensor-parallel ranks x D replicas is labelled "P x D" (sweeps before --dp had P only)
    # (and with S pipeline stages "P x D x S"; sweeps before --pp had no S)
    labels = [r["P"] + (" x " + r["D"] if "D" in r else "") + (" x " + r["S"] if r.get("S") not in (None, "", "1") else "")
              for r in rows]
    tps = [float(r["tok_per_s"]) for r in rows]
    comm = [100 * (float(r["comm_share"]) + float(r.get("dp_share") or 0)) for r in rows]
    mb = [float(r["mb_per_rank"]) for r in rows]
    # sweeps since --plan also hold the model's prediction of every row: drawn against the measurement
    # (the pipeline's rows have none: the model does not cover stages; they are drawn measured only)
    predicted = "predicted_ms_per_step" in rows[0] and any(r.get("predicted_ms_per_step") for r in rows)
    fig, axes = plt.subplots(1, 4 if predicted else 3, figsize=(14.5 if predicted else 11, 3.4))
    axes[0].bar(labels, tps, color="tab:blue")
    axes[0].set_title("tokens / s")
    axes[1].bar(labels, comm, color="tab:orange")
    axes[1].set_title("time in collectives, TP + DP (%)")
    axes[2].bar(labels, mb, color="tab:green")
    axes[2].set_title("memory per rank (MB)")
    if predicted:
        x = range(len(rows))
        meas = [float(r["ms_per_step"]) for r in rows]
        pred = [float(r["predicted_ms_per_step"] or "nan") for r in rows]
        axes[3].bar([i - 0.2 for i in x], meas, width=0.4, color="tab:blue", label="measured")
        axes[3].bar([i + 0.2 for i in x], pred, width=0.4, color="tab:gray", label="predicted (--plan)")
        axes[3].set_xticks(list(x))
        axes[3].set_xticklabels(labels)
        axes[3].set_title("ms per step: measured and predicted")
        axes[3].legend(fontsize=8)
    for ax in axes:
        ax.set_xlabel(("TP ranks P x replicas D" + (" (x stages S)" if "S" in rows[0] else "")) if "D" in rows[0] else "tensor-parallel ranks P")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description="plot ./tp's log.csv and sweep.csv")
    ap.add_argument("dir", help="the -o directory of a ./tp run")
    ap.add_argument("--floor", type=float, default=0.0, help="draw the loss floor at this value")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed: pip install matplotlib")
    log, sweep = os.path.join(args.dir, "log.csv"), os.path.join(args.dir, "sweep.csv")
    if not os.path.exists(log) and not os.path.exists(sweep):
        fail(f"{args.dir} holds neither log.csv nor sweep.csv: run ./tp -o {args.dir} (and --sweep 1) first")
    if os.path.exists(log):
        plot_loss(plt, log, os.path.join(args.dir, "loss.png"), args.floor)
    if os.path.exists(sweep):
        plot_sweep(plt, sweep, os.path.join(args.dir, "sweep.png"))


if __name__ == "__main__":
    main()

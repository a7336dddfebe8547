"""The bar chart of ``python -m torchext bench --plot``: per device, the
speed-up of torchext over each other setup, and the fraction of the
bandwidth bound reached. Needs matplotlib (``pip install torchext[bench]``)."""


def plot(doc, path):
    """doc: the dict of torchext.bench.to_json(); writes a PNG to path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    fig, axes = plt.subplots(len(runs), 2, figsize=(13, 4.2 * len(runs)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1]})
    for (ax_speed, ax_bw), run in zip(axes, runs):
        results = run["results"]
        labels = [f"{r['benchmark']}: {r['case']}" for r in results]
        # (torchext's own other setups, e.g. "torchext + GradScaler", are not baselines)
        baselines = list(dict.fromkeys(k for r in results for k in r["speedup"]
                                       if not k.startswith("torchext")))
        width = 0.8 / max(len(baselines), 1)
        for j, base in enumerate(baselines):
            xs = [i + (j - (len(baselines) - 1) / 2) * width for i, r in enumerate(results)
                  if base in r["speedup"]]
            ys = [r["speedup"][base] for r in results if base in r["speedup"]]
            ax_speed.bar(xs, ys, width, label=f"vs {base}")
        ax_speed.axhline(1.0, color="black", linewidth=0.8)
        ax_speed.set_xticks(range(len(results)), labels, rotation=20, ha="right", fontsize=8)
        ax_speed.set_ylabel("torchext speed-up (x)")
        ax_speed.set_title(f"{run['device']}, {run['threads']} threads, "
                           f"torch {doc['torch_version']}")
        ax_speed.legend(fontsize=7)
        bw = [(lab, r["bandwidth_fraction"]) for lab, r in zip(labels, results)
              if r["bandwidth_fraction"] is not None]
        ax_bw.bar(range(len(bw)), [100 * f for _, f in bw], color="tab:green")
        ax_bw.axhline(100, color="black", linewidth=0.8)
        ax_bw.set_xticks(range(len(bw)), [lab for lab, _ in bw], rotation=20, ha="right",
                         fontsize=8)
        ax_bw.set_ylabel(f"% of bandwidth bound ({run['bandwidth_GBps']['bound']:.0f} GB/s)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_compile(results, path, title=""):
    """The compiled-training matrix (torchext/bench/compile.py): per model,
    the time to steady state of each recipe (log scale), and torchext's
    speed-up per step over each recipe it was timed with in one process.
    results: Result dicts."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = list(dict.fromkeys(r for res in results for r in res["extra"]["recipes"]))
    from .compile import base_recipe
    others = [r for r in recipes if r != base_recipe(r)]  # (each against its own base)
    labels = [f"{res['case']}\n({res['extra']['tensors']} tensors)" for res in results]
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(14, 4.8))
    colors = {r: f"C{i}" for i, r in enumerate(recipes)}
    for panel, names in ((ax_t, recipes), (ax_s, others)):
        width = 0.8 / max(len(names), 1)
        for j, rec in enumerate(names):
            xs, ys = [], []
            for i, res in enumerate(results):
                row = res["extra"]["recipes"].get(rec)
                if row is None or "error" in row:
                    continue
                y = row["to_steady_s"] if panel is ax_t else res["speedup"].get(rec)
                if y is None:
                    continue
                xs.append(i + (j - (len(names) - 1) / 2) * width)
                ys.append(y)
            panel.bar(xs, ys, width, label=rec, color=colors[rec])
    ax_t.set_yscale("log")
    ax_t.set_ylabel("seconds to steady state (cold cache)")
    ax_t.legend(fontsize=7, loc="upper left")
    ax_s.axhline(1.0, color="black", linewidth=0.8)
    ax_s.set_ylabel("torchext's recipe: speed-up per step over (x)")
    ax_s.legend(fontsize=7, loc="upper left")
    for ax in (ax_t, ax_s):
        ax.set_xticks(range(len(results)), labels, fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)

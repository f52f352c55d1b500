"""Turn a suite result (JSON) into a Markdown table and a PNG chart."""

from __future__ import annotations

from pathlib import Path


def cell(entry: dict) -> str:
    status = entry["status"]
    if status.startswith("hang"):
        return "hangs"
    if status != "ok":
        return "fails: " + status.removeprefix("error: ").split(":")[0]
    text = f"{entry['median']:.2f} s"
    if entry["n"] > 1:
        text += f" ({entry['min']:.2f}-{entry['max']:.2f})"
    if "worker_uss_mb" in entry:
        text += f", {entry['worker_uss_mb']:.0f} MB/worker"
    if "first_batch_s" in entry:
        text += f", first batch {entry['first_batch_s']:.2f} s"
    if not entry.get("correct", True):
        text += ", WRONG DATA"
    return text


def ratio(entry: dict) -> str:
    value = entry.get("ratio_to_safeloader")
    text = f"{value:.2f}x" if value else "-"
    if entry.get("first_batch_ratio_to_safeloader"):
        text += f" (first batch {entry['first_batch_ratio_to_safeloader']:.2f}x)"
    return text


def markdown(result: dict) -> str:
    lines = []
    for scenario, contenders in result["scenarios"].items():
        lines += [f"**{scenario}**", "", "| contender | median (min-max) | vs safeloader |", "|---|---|---|"]
        for name, entry in contenders.items():
            label = f"**{name}**" if name == "safeloader" else name
            lines.append(f"| {label} | {cell(entry)} | {ratio(entry)} |")
        lines.append("")
    machine = result["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    config = result["config"]
    lines.append(f"{machine['cores']} cores, {versions}; {machine['date']}; {config['repeats']} rounds, "
                 f"{config['scale']} sizes.")
    return "\n".join(lines)


def chart(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = result["scenarios"]
    height = 1.0 + 0.42 * sum(len(c) for c in scenarios.values())
    fig, axes = plt.subplots(len(scenarios), 1, figsize=(9, height), squeeze=False)
    for axis, (scenario, contenders) in zip(axes[:, 0], scenarios.items()):
        names = list(contenders)
        medians = [contenders[n].get("median") or 0 for n in names]
        top = max(medians) or 1
        # safeloader green, thread-based loading blue, the other process-based ways gray
        colors = ["tab:green" if n == "safeloader" else "tab:blue" if n.startswith("threads") else "tab:gray"
                  for n in names]
        axis.barh(names, medians, color=colors)
        for y, name in enumerate(names):
            entry = contenders[name]
            label = cell(entry).split(" (")[0] if entry["status"] == "ok" else cell(entry)
            if entry["status"] == "ok" and "ratio_to_safeloader" in entry:
                label += f"  ({entry['ratio_to_safeloader']:.2f}x)"
            axis.text((medians[y] or 0) + top * 0.01, y, label, va="center", fontsize=7,
                      color="tab:red" if entry["status"] != "ok" or not entry.get("correct", True) else "black")
        axis.set_xlim(0, top * 1.6)
        axis.invert_yaxis()
        axis.set_title(scenario, fontsize=9, loc="left")
        axis.tick_params(labelsize=7)
        axis.set_xlabel("seconds (median)", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
